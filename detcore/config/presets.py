"""Preset configs by name: ``torchvision/mask_rcnn_R_50_FPN.yaml`` as well as a path.

The presets are the yaml files of the repository's configs/ folder. A wheel ships them inside the
package (detcore/configs/, setup.py maps the folder there); a clone keeps them in configs/ beside
the package. ``resolve_config_file`` turns what a user gives ``--config-file`` (or
``CfgNode.merge_from_file``) into a file:

    configs/e2e_mask_rcnn_R_18_FPN_shapes.yaml    a path that exists is used as it is
    torchvision/mask_rcnn_R_50_FPN.yaml           else a name relative to the presets' folder
    configs/torchvision/mask_rcnn_R_50_FPN.yaml   the clone's spelling works from a wheel too
    torchvision/mask_rcnn_R_50_FPN                and the ".yaml" may be left out
"""
import difflib
import os
from pathlib import Path
from typing import List

__all__ = ["config_roots", "list_presets", "resolve_config_file"]

_PREFIXES = ("./configs/", "configs/")


def config_roots() -> List[Path]:
    """The folders the presets may be in: inside the installed package (a wheel), then the
    clone's configs/ beside the package. Only those that exist."""
    package = Path(__file__).resolve().parents[1]
    return [root for root in (package / "configs", package.parent / "configs") if root.is_dir()]


def list_presets() -> List[str]:
    """Every preset's name (its path under the presets' folder, with ".yaml"), sorted."""
    names = set()
    for root in config_roots():
        names.update(p.relative_to(root).as_posix() for p in root.rglob("*.yaml"))
    return sorted(names)


def _candidates(name: str) -> List[str]:
    """Names under the presets' folder that ``name`` may stand for."""
    names = [name]
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            names.append(name[len(prefix):])
    return names + [n + ".yaml" for n in names if not n.endswith((".yaml", ".yml"))]


def resolve_config_file(name) -> str:
    """The config file ``name`` stands for: itself when it is a file, else the preset of that
    name (see the module docstring). FileNotFoundError naming the folders searched and the
    closest preset names when it is neither."""
    name = os.fspath(name)
    if os.path.isfile(os.path.expanduser(name)):
        return name
    if not os.path.isabs(name):
        for root in config_roots():
            for candidate in _candidates(name.replace(os.sep, "/")):
                path = root / candidate
                if path.is_file():
                    return str(path)
    stripped = _candidates(name)[-1]
    close = difflib.get_close_matches(stripped, list_presets(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    roots = ", ".join(str(r) for r in config_roots()) or "none found"
    raise FileNotFoundError(
        f"config file {name} does not exist, and it names no preset in detcore's configs folder ({roots}){hint}"
    )
