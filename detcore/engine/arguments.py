"""The command-line arguments of detcore's commands, each defined once.

``detcore train`` (and ``tools/train_net.py``) parse ``default_argument_parser()``; the other
commands (detcore/cli/) build their parsers from the same pieces, so ``--config-file``, the KEY
VALUE overrides, ``--resume`` and the machine options read and mean the same everywhere:

    add_config_argument(parser)     --config-file: a path, or a preset's name (config/presets.py)
    add_run_arguments(parser)       --resume | --start-over, --eval-only
    add_machine_arguments(parser)   --num-gpus, --num-machines, --machine-rank, --dist-url
    add_overrides_argument(parser)  KEY VALUE ... (last: it takes the rest of the command line)

Processes are started by torchrun. ``--num-gpus N`` (or ``--num-machines``) asks
``launch`` to start them: it runs the same command again under torchrun (``torchrun_command``),
as if typed ``torchrun --nproc_per_node N ...``; a command started by torchrun runs as it is.
"""
import argparse
import os
import sys
from typing import List, Optional, Sequence

from detcore.utils.argtypes import integer

__all__ = [
    "add_config_argument",
    "add_machine_arguments",
    "add_overrides_argument",
    "add_run_arguments",
    "default_argument_parser",
    "started_by_torchrun",
    "torchrun_command",
    "wants_torchrun",
]

DISTRIBUTED_EPILOG = (
    "Distributed: --num-gpus N (N processes on this machine), or torchrun --nproc_per_node N "
    "tools/train_net.py --config-file X ...\n"
    "(multi-node: --num-machines M --machine-rank R --dist-url tcp://HOST:PORT, or torchrun's "
    "--nnodes / --node_rank / --master_addr / --master_port)"
)


def add_config_argument(parser: argparse.ArgumentParser, required: bool = True, help: Optional[str] = None) -> None:
    parser.add_argument(
        "--config-file", required=required, metavar="FILE",
        help=help or "the yaml config: a path, or a preset's name such as torchvision/mask_rcnn_R_50_FPN.yaml "
        "(detcore configs lists them)",
    )


def add_overrides_argument(parser: argparse.ArgumentParser, help: Optional[str] = None) -> None:
    parser.add_argument(
        "opts", nargs=argparse.REMAINDER, default=[],
        help=help or "config overrides as KEY VALUE pairs, e.g. SOLVER.MAX_ITER 100 OUTPUT_DIR out/",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_mutually_exclusive_group()  # each says what to do with a previous run's folder
    run.add_argument(
        "--resume", action="store_true",
        help="continue from OUTPUT_DIR/last_checkpoint (model, optimizer, schedule, iteration, RNG)",
    )
    run.add_argument(
        "--start-over", action="store_true",
        help="train from scratch into an OUTPUT_DIR that holds a previous run (its files are moved into a "
        "replaced_<time> subfolder); without it, such a folder is refused unless --resume",
    )
    parser.add_argument("--eval-only", action="store_true", help="only evaluate MODEL.WEIGHTS (or the last checkpoint with --resume)")


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    machines = parser.add_argument_group("processes (started through torchrun; not needed when torchrun starts the command)")
    machines.add_argument(
        "--num-gpus", type=integer(1), default=1, metavar="N",
        help="processes on this machine, one per GPU (with MODEL.DEVICE cpu: N CPU processes); default 1",
    )
    machines.add_argument("--num-machines", type=integer(1), default=1, metavar="M", help="machines taking part; default 1")
    machines.add_argument("--machine-rank", type=integer(0), default=0, metavar="R", help="this machine's rank (0..M-1)")
    machines.add_argument(
        "--dist-url", default="auto", metavar="URL",
        help="tcp://HOST:PORT of machine 0 (several machines); auto: a free port on this machine",
    )


def default_argument_parser(description: Optional[str] = None) -> argparse.ArgumentParser:
    """The arguments of training (``detcore train``, ``tools/train_net.py``): the config, what to
    do with a previous run, the machine options and the overrides."""
    parser = argparse.ArgumentParser(
        description=description or "detcore training / evaluation",
        epilog=DISTRIBUTED_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_argument(parser)
    add_run_arguments(parser)
    add_machine_arguments(parser)
    add_overrides_argument(parser)
    return parser


def started_by_torchrun() -> bool:
    """Whether this process is one of torchrun's workers."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def wants_torchrun(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for processes that torchrun has not started yet."""
    processes = getattr(args, "num_gpus", 1) * getattr(args, "num_machines", 1)
    return processes > 1 and not started_by_torchrun()


def torchrun_command(args: argparse.Namespace, argv: Sequence[str], main_module: Optional[str] = None) -> List[str]:
    """The torchrun command that runs this command (``argv``: sys.argv) with ``args``' processes.

    ``main_module``: the module run by ``python -m`` (``detcore.cli``), else ``argv[0]`` is the
    script (tools/train_net.py, or the ``detcore`` console script, itself a Python file)."""
    if args.num_machines > 1 and not 0 <= args.machine_rank < args.num_machines:
        raise ValueError(f"--machine-rank must be in 0..{args.num_machines - 1} (--num-machines {args.num_machines}), "
                         f"got {args.machine_rank}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.num_gpus)]
    if args.num_machines == 1:
        cmd.append("--standalone")
    else:
        if not args.dist_url.startswith("tcp://") or ":" not in args.dist_url[len("tcp://"):]:
            raise ValueError(f"--dist-url must be tcp://HOST:PORT of machine 0 with --num-machines {args.num_machines}, "
                             f"got {args.dist_url!r}")
        host, port = args.dist_url[len("tcp://"):].rsplit(":", 1)
        cmd += ["--nnodes", str(args.num_machines), "--node_rank", str(args.machine_rank),
                "--master_addr", host, "--master_port", port]
    program = ["-m", main_module] if main_module else [argv[0]]
    return cmd + program + list(argv[1:])
