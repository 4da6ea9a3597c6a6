"""``detcore env``: the environment report to paste into a bug report (detcore/utils/collect_env.py)."""
import argparse
from typing import Optional, Sequence

DESCRIPTION = "Print the versions, build and hardware that matter (paste it into a bug report)."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    return build_parser(prog, description).parse_args(argv)


def main(args):
    from detcore.utils.collect_env import collect_env_info

    print(collect_env_info())


run = main
