"""``detcore configs``: the preset configs that ship with detcore, by name.

    detcore configs                                   # every preset's name
    detcore configs torchvision/mask_rcnn_R_50_FPN    # its file and its full config (after _BASE_)

A name works wherever a config file does: ``detcore train --config-file NAME`` (config/presets.py).
"""
import argparse
from typing import Optional, Sequence

DESCRIPTION = "List the preset configs shipped with detcore, or show one's file and full config."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    parser.add_argument("name", nargs="?", help="a preset's name (or a config file): print its path and full config")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    return build_parser(prog, description).parse_args(argv)


def main(args):
    from detcore.config import get_cfg, list_presets, resolve_config_file

    if args.name is None:
        print("\n".join(list_presets()))
        return
    try:
        path = resolve_config_file(args.name)
    except FileNotFoundError as e:
        raise SystemExit(f"configs: {e}") from None
    cfg = get_cfg()
    cfg.merge_from_file(path)
    print(f"# {path}\n{cfg.dump()}", end="")


run = main
