"""``detcore download``: fetch weights of the model zoo catalog (or a URL) into the cache.

    detcore download torchvision/mask_rcnn_R_50_FPN      # prints the cached file's path
    detcore download --list                              # the catalog: names, presets, URLs

The file is verified and cached as MODEL.WEIGHTS NAME would do (detcore/checkpoint/model_zoo.py);
``$DETCORE_CACHE`` sets the cache folder, ``$DETCORE_WEIGHTS_MIRROR`` a mirror of the publishers.
"""
import argparse
from typing import Optional, Sequence

_URL_SCHEMES = ("https://", "http://", "detectron2://")

DESCRIPTION = "Download weights of the model zoo catalog (or a URL) into the cache and print their paths."


def build_parser(prog: Optional[str] = None, description: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION)
    parser.add_argument("names", nargs="*", metavar="NAME", help="catalog names (or aliases, or https:// URLs)")
    parser.add_argument("--list", action="store_true", help="print the catalog (a markdown table) instead")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, description: Optional[str] = None):
    parser = build_parser(prog, description)
    args = parser.parse_args(argv)
    if not args.names and not args.list:
        parser.error("give the NAME of a model (detcore download --list shows them), or --list")
    return args


def main(args):
    from detcore.checkpoint import model_zoo
    from detcore.checkpoint.download import DownloadError

    if args.list:
        print(model_zoo.catalog_table())
    paths = []
    for name in args.names:
        try:
            if not name.startswith(_URL_SCHEMES) and model_zoo.lookup(name) is None:
                model_zoo.get_entry(name)  # no catalog name: KeyError naming the closest ones
            paths.append(model_zoo.resolve_weights(name))
        except KeyError as e:
            raise SystemExit(f"download: {e.args[0]}") from None
        except (DownloadError, ValueError) as e:  # the message names the URL and the cache path
            raise SystemExit(f"download: {e}") from None
        print(paths[-1])
    return paths


run = main
