"""Logging setup: rank 0 logs to the console, every rank to a file in the output folder.

    setup_logger(output="output/run1", distributed_rank=comm.get_rank())
    logging.getLogger("detcore.engine").info("...")   # goes to the console and output/run1/log.txt

All of detcore logs under the ``"detcore"`` logger, so one call configures every module. Calling
it again (a second run in the same process, as tests do) replaces the handlers it added before
instead of stacking duplicates.
"""
import logging
import os
import sys
from typing import Optional

__all__ = ["setup_logger", "log_file_path"]

_FORMAT = "[%(asctime)s %(name)s %(levelname)s] %(message)s"
_DATE_FORMAT = "%m/%d %H:%M:%S"
_MARK = "_detcore_handler"  # set on handlers this module added, so they can be replaced


def log_file_path(output: str, distributed_rank: int = 0) -> str:
    """Where ``setup_logger`` writes: ``output`` itself when it ends in .txt/.log, else
    ``output/log.txt``; ranks other than 0 get a ``.rank<N>`` suffix (no interleaved lines)."""
    path = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
    return path if distributed_rank == 0 else f"{path}.rank{distributed_rank}"


def setup_logger(
    output: Optional[str] = None,
    distributed_rank: int = 0,
    name: str = "detcore",
    level: int = logging.INFO,
) -> logging.Logger:
    """Configure logger ``name``: console (stdout, rank 0 only) and, with ``output``, a file.

    Returns the logger. Messages do not propagate to the root logger, so a user's own root
    configuration does not print them twice.
    """
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    for handler in [h for h in logger.handlers if getattr(h, _MARK, False)]:
        logger.removeHandler(handler)
        handler.close()

    formatter = logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT)
    if distributed_rank == 0:
        console = logging.StreamHandler(stream=sys.stdout)
        console.setLevel(level)
        console.setFormatter(formatter)
        setattr(console, _MARK, True)
        logger.addHandler(console)
    if output:
        path = log_file_path(output, distributed_rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        file_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(formatter)
        setattr(file_handler, _MARK, True)
        logger.addHandler(file_handler)
    return logger
