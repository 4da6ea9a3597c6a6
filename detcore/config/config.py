"""A yacs `CfgNode` with `_BASE_` inheritance and errors that say what went wrong.

yacs gives the tree, attribute access, `clone`/`freeze`/`dump` and the value parsing
(`literal_eval` on strings). On top of it this file adds:

- `merge_from_file` follows `_BASE_: other.yaml` (relative to the file that names it,
  chains allowed); a missing base file or a cycle is an error naming the files;
- an unknown key (in a file, a list or another cfg) names the key, where it came from and
  the closest existing key ("did you mean MODEL.RPN.NMS_THRESH?");
- a type mismatch names the key, the expected type and the value given;
- a value outside a key's closed set of values or range, a NaN or infinite number, a list of
  the wrong shape, or a device detcore's ops do not run on (config/choices.py), names the key and
  what it may be;
- a merge is all or nothing: it runs on a copy, so a bad file leaves the config untouched.
"""
import ast
import difflib
import os

import yaml
from yacs.config import CfgNode as _YacsCfgNode

from .choices import find_problems
from .presets import resolve_config_file

BASE_KEY = "_BASE_"

# The leaf types yacs allows in a config (anything yaml.safe_dump can write back).
_LEAF_TYPES = (tuple, list, str, int, float, bool, type(None))


class ConfigError(ValueError):
    """A config file, override list or value that cannot be merged."""


class UnknownKeyError(ConfigError, KeyError):
    """A key that is not in the config. A KeyError too, as in yacs."""

    def __str__(self):
        # KeyError would print the message in quotes; show it as a sentence.
        return str(self.args[0]) if self.args else ""


class ConfigTypeError(ConfigError, TypeError):
    """A value whose type does not match the key's default (a ValueError too, as in yacs)."""


class CfgNode(_YacsCfgNode):
    """Config tree: `cfg.MODEL.RPN.NMS_THRESH`. See the module docstring for what is added."""

    # --- merging -------------------------------------------------------------------------

    def merge_from_file(self, cfg_filename):
        """Merge a yaml file, after the `_BASE_` chain it names (base first). A name that is no
        file may name a preset: "torchvision/mask_rcnn_R_50_FPN.yaml" (config/presets.py)."""
        cfg_filename = resolve_config_file(cfg_filename)
        chain = _load_base_chain(cfg_filename)

        def merge(work):
            for path, data in chain:
                work._merge_dict(data, path)

        self._merge_atomically(merge, os.fspath(cfg_filename))

    def merge_from_other_cfg(self, cfg_other):
        """Merge another CfgNode (or a plain nested dict) into this one."""
        if not isinstance(cfg_other, dict):
            got = type(cfg_other).__name__
            raise ConfigError(f"merge_from_other_cfg expects a CfgNode or dict, got {got}")
        self._merge_atomically(lambda cfg: cfg._merge_dict(cfg_other, "the merged config"), "the merged config")

    def merge_from_list(self, cfg_list):
        """Merge ["KEY.PATH", value, ...] pairs, e.g. from the command line.

        String values are parsed with `ast.literal_eval` like yacs does ("0.6" -> 0.6,
        "(640, 800)" -> tuple); a string that is not a Python literal stays a string.
        """
        if isinstance(cfg_list, (str, bytes)) or len(cfg_list) % 2 != 0:
            raise ConfigError(
                f"override list must hold KEY VALUE pairs (even length), got {list(cfg_list)!r}"
            )
        pairs = list(zip(cfg_list[0::2], cfg_list[1::2]))

        def merge(work):
            for key, value in pairs:
                work._merge_pair(key, value)

        self._merge_atomically(merge, "the override list")

    def _merge_atomically(self, merge, source):
        """Run `merge` on a copy and write the result back only if it succeeds and every key with
        a closed set of values (config/choices.py) holds one of them."""
        if self.is_frozen():
            raise AttributeError("config is frozen; call cfg.defrost() before merging into it")
        work = self.clone()
        merge(work)
        before = dict(find_problems(self))
        for key, message in find_problems(work):
            if before.get(key) == message:
                continue  # set before this merge (in code): not this source's fault
            raise ConfigError(f"config key {key} in {source} {message}")
        _copy_into(work, self)

    def _merge_dict(self, data, source, prefix="", root=None):
        """Recursively merge a nested dict into this (work) node; `source` is for messages."""
        root = self if root is None else root
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
        for key, raw in data.items():
            full_key = prefix + str(key)
            if key not in self:
                if self.is_new_allowed():
                    self[key] = _new_value(raw, type(self))
                    continue
                if root._is_deprecated_or_renamed(full_key):
                    continue
                leaf = _first_leaf(full_key, raw)
                raise UnknownKeyError(_unknown_key_message(leaf, full_key, source, root))
            current = self[key]
            if isinstance(current, _YacsCfgNode):
                if not isinstance(raw, dict):
                    raise ConfigTypeError(_group_message(full_key, raw, source))
                CfgNode._merge_dict(current, raw, source, full_key + ".", root)
            else:
                self[key] = _coerce(raw, current, full_key, source)

    def _merge_pair(self, full_key, raw):
        source = "the override list"
        if not isinstance(full_key, str):
            raise ConfigError(f"{source}: keys must be strings like 'MODEL.RPN.NMS_THRESH', got {full_key!r}")
        if self._is_deprecated_or_renamed(full_key):
            return
        *parents, leaf = full_key.split(".")
        node = self
        for i, name in enumerate(parents):
            if name not in node or not isinstance(node[name], _YacsCfgNode):
                where = ".".join(parents[: i + 1])
                raise UnknownKeyError(_unknown_key_message(full_key, where, source, self))
            node = node[name]
        if leaf not in node:
            raise UnknownKeyError(_unknown_key_message(full_key, full_key, source, self))
        if isinstance(node[leaf], _YacsCfgNode):
            raise ConfigTypeError(_group_message(full_key, raw, source))
        node[leaf] = _coerce(raw, node[leaf], full_key, source)

    def _is_deprecated_or_renamed(self, full_key):
        """yacs' registries on the root: deprecated keys are skipped (with a warning),
        renamed ones raise an error that names the new key."""
        if self.key_is_deprecated(full_key):
            return True
        if self.key_is_renamed(full_key):
            self.raise_key_rename_error(full_key)
        return False


# --- loading yaml with _BASE_ -------------------------------------------------------------


def _load_base_chain(path, _stack=()):
    """[(path, dict), ...] from the farthest base to `path`, `_BASE_` removed."""
    path = os.path.abspath(os.path.expanduser(path))
    if path in _stack:
        cycle = " -> ".join(list(_stack[_stack.index(path):]) + [path])
        raise ConfigError(f"_BASE_ cycle in config files: {cycle}")
    if not os.path.isfile(path):
        if _stack:
            raise FileNotFoundError(f"_BASE_ file {path} (named in {_stack[-1]}) does not exist")
        raise FileNotFoundError(f"config file {path} does not exist")
    with open(path, "r") as f:
        data = yaml.safe_load(f)  # a syntax error names the file (yaml reads f.name)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys, got {type(data).__name__}")
    base = data.pop(BASE_KEY, None)
    if base is None:
        return [(path, data)]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: _BASE_ must be one file path (a string), got {base!r}")
    base_path = os.path.expanduser(base)
    if not os.path.isabs(base_path):
        base_path = os.path.join(os.path.dirname(path), base_path)
    return _load_base_chain(base_path, _stack + (path,)) + [(path, data)]


# --- values ---------------------------------------------------------------------------------


def _decode(raw):
    """yacs' parsing: strings go through literal_eval, falling back to the plain string."""
    if not isinstance(raw, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _coerce(raw, default, full_key, source):
    """Parse `raw` and check it against the type of the key's current value."""
    value = _decode(raw)
    if isinstance(default, str) and isinstance(raw, str) and not isinstance(value, (str, type(None))):
        # A string key given "123" or "True": the user meant the text, not a literal.
        value = raw
    if isinstance(value, dict) or type(value) not in _LEAF_TYPES:
        raise ConfigTypeError(_type_message(full_key, default, value, source))
    if type(value) is type(default) or value is None or default is None:
        return value  # None may stand in for any type, as in yacs
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)  # yaml has no tuples
    if isinstance(default, list) and isinstance(value, tuple):
        return list(value)
    if type(default) is float and type(value) is int:
        return float(value)  # "BASE_LR: 1" means 1.0; bool is not an int here
    raise ConfigTypeError(_type_message(full_key, default, value, source))


def _new_value(raw, node_cls):
    value = _decode(raw)
    return node_cls(value, new_allowed=True) if isinstance(value, dict) else value


def _copy_into(src, dst):
    """Write the merged `src` into `dst` in place, so references to sub-nodes stay valid."""
    for k, v in src.items():
        if isinstance(v, _YacsCfgNode) and isinstance(dst.get(k), _YacsCfgNode):
            _copy_into(v, dst[k])
        else:
            dict.__setitem__(dst, k, v)


# --- messages --------------------------------------------------------------------------------


def _leaf_keys(node, prefix=""):
    keys = []
    for k, v in node.items():
        if isinstance(v, _YacsCfgNode):
            keys.extend(_leaf_keys(v, f"{prefix}{k}."))
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _first_leaf(full_key, raw):
    """For an unknown section given as a dict, the first full key the user wrote under it."""
    while isinstance(raw, dict) and raw:
        k, raw = next(iter(raw.items()))
        full_key = f"{full_key}.{k}"
    return full_key


def _unknown_key_message(key, unknown_part, source, root):
    # Suggestions come from the whole tree, so a key put in the wrong section
    # ("SOLVER.NUM_WORKERS") still finds its home ("DATALOADER.NUM_WORKERS").
    close = difflib.get_close_matches(key, _leaf_keys(root), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; no similar key exists"
    where = f" ({unknown_part} does not exist)" if unknown_part != key else ""
    return f"unknown config key {key}{where} in {source}{hint}"


def _type_message(full_key, default, value, source):
    return (
        f"type mismatch for config key {full_key} in {source}: expected {type(default).__name__} "
        f"(like the default {default!r}), got {type(value).__name__} {value!r}"
    )


def _group_message(full_key, raw, source):
    return (
        f"config key {full_key} in {source} is a group of keys, not a value; "
        f"got {raw!r}; set one of its keys instead, e.g. {full_key}.<KEY>"
    )
