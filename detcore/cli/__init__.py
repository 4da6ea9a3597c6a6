"""The ``detcore`` command: one entry point (setup.py's console script) for the user's jobs.

    detcore train --config-file e2e_mask_rcnn_R_18_FPN_shapes.yaml OUTPUT_DIR out/
    detcore test --config-file e2e_mask_rcnn_R_18_FPN_shapes.yaml MODEL.WEIGHTS out/model_final.pth
    detcore demo --model torchvision/mask_rcnn_R_50_FPN --input photo.jpg --output pictures/

Each command is a module here with ``build_parser`` / ``parse_args`` (its arguments, built from
detcore/engine/arguments.py's shared pieces), ``main(args)`` (the work) and ``run(args)`` (how
the command runs it: ``launch`` for those that may run distributed). The scripts in tools/ are
thin callers of the same modules, so ``python tools/train_net.py`` and ``detcore train`` are
one program.
"""
import argparse
import importlib
import sys
from typing import Optional, Sequence

__all__ = ["COMMANDS", "main"]

# command -> module in detcore.cli (the module of ``test`` is not called test.py: tools read
# such names as test files).
COMMANDS = {
    "train": "train",
    "test": "evaluate",
    "demo": "demo",
    "export": "export",
    "convert": "convert",
    "download": "download",
    "configs": "configs",
    "env": "env",
}


def command_module(name: str):
    return importlib.import_module(f"detcore.cli.{COMMANDS[name]}")


def _top_parser() -> argparse.ArgumentParser:
    from detcore import __version__

    lines = [f"  {name:<9} {command_module(name).DESCRIPTION}" for name in COMMANDS]
    parser = argparse.ArgumentParser(
        prog="detcore",
        usage="detcore [-h] [--version] COMMAND [ARGS ...]",
        description="detcore: Mask R-CNN style detection and instance segmentation.",
        epilog="commands:\n" + "\n".join(lines) + "\n\n'detcore COMMAND --help' shows a command's arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"detcore {__version__}")
    parser.add_argument("command", metavar="COMMAND", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``detcore COMMAND ARGS...`` (``argv``: the arguments after ``detcore``). Returns 0;
    errors exit through SystemExit with argparse's status 2 or the command's message."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        parser = _top_parser()
        if not argv:
            parser.print_help()
            return 2
        parser.parse_args(argv[:1])  # -h / --version exit here; another option is refused
        return 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        _top_parser().error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    module = command_module(name)
    module.run(module.parse_args(rest, prog=f"detcore {name}"))
    return 0
