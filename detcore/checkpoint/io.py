"""Reading checkpoint files without running code from them.

A `.pkl` model-zoo file (detectron2, Detectron) is a plain pickle of numpy arrays. `pickle.load`
would import and call whatever the file names, so it goes through `_NumpyUnpickler`, which
resolves only numpy's array / dtype / scalar reconstruction functions and a few builtin
containers; any other global is refused. Everything else (torch `.pth` / `.pt`, zip or legacy)
goes through `torch.load(weights_only=True)`, torch's own restricted loader.

Before either, the file's pickles are judged by type (pickle_scan.py), so nothing large or unsafe is
built from a hostile file. `load_checkpoint_object` is that one reader, for every checkpoint detcore
reads. `read_checkpoint` then unwraps the usual containers ({"model": ...}, {"state_dict": ...},
Detectron's {"blobs": ...}) and returns a flat name -> Tensor dict plus the entries it skipped.
"""
import importlib
import io
import pickle
import reprlib
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from .pickle_scan import check_pickle_file, check_zip_archive

__all__ = ["describe_file", "load_checkpoint_object", "read_checkpoint", "safe_pickle_load", "unwrap_state_dict"]

# numpy moved its internals from numpy.core to numpy._core in 2.0; old pickles name the former.
_NUMPY_GLOBALS = {
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"): ("multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): ("multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"): ("multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"): ("multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"): ("numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"): ("numeric", "_frombuffer"),
}
# Plain data types; nothing that can evaluate, import or reach attributes.
_SAFE_BUILTINS = {
    "dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray", "int", "float",
    "complex", "bool", "slice", "range",
}  # fmt: skip
_OTHER_SAFE = {
    ("collections", "OrderedDict"),
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(text, "latin1").
    ("_codecs", "encode"),
}


def _numpy_internal(submodule: str):
    for prefix in ("numpy._core.", "numpy.core."):
        try:
            return importlib.import_module(prefix + submodule)
        except ImportError:
            continue
    raise ImportError(f"cannot find numpy's {submodule} module")


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickler that builds numpy arrays and builtin containers, and refuses everything else."""

    def find_class(self, module, name):
        target = _NUMPY_GLOBALS.get((module, name))
        if target is not None:
            where, attr = target
            return getattr(np if where == "numpy" else _numpy_internal(where), attr)
        if module in ("builtins", "__builtin__") and name in _SAFE_BUILTINS:
            return super().find_class("builtins", name)
        if (module, name) in _OTHER_SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle '{module}.{name}': model-zoo pickles hold only numpy arrays and "
            "builtin containers, and loading other objects would run code from the file"
        )


def safe_pickle_load(data: bytes):
    """Unpickle `data` allowing only numpy arrays and builtin containers. Python 2 pickles
    (Detectron) are read with latin1 for their byte strings."""
    return _NumpyUnpickler(io.BytesIO(data), encoding="latin1").load()


def describe_file(path) -> str:
    """What a file that failed to load as a checkpoint seems to be, from its first bytes, for
    error messages ("a text file starting with 'hello'", "a zip archive cut short", ...)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(256)
    if size == 0:
        return "an empty file"
    if head.startswith(b"PK\x03\x04"):
        if zipfile.is_zipfile(path):
            return f"a zip archive of {size} bytes (a torch.save checkpoint or another zip file)"
        return f"a zip archive cut short ({size} bytes; a torch.save checkpoint whose writing was interrupted?)"
    if head[:1] == b"\x80":
        return "a Python pickle (a legacy torch.save file or a model-zoo .pkl)"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy .npy array file"
    if head.startswith(b"\x89HDF"):
        return "an HDF5 file (Keras / TensorFlow weights?)"
    if head.startswith(b"\x89PNG") or head.startswith(b"\xff\xd8"):
        return "an image file"
    if len(head) > 8 and int.from_bytes(head[:8], "little") < size and head[8:9] == b"{":
        return "a safetensors file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\r\n\t" for c in text):
        return f"a text file starting with {text[:40]!r}"
    return f"binary data of an unknown kind ({size} bytes, starting with {head[:8].hex(' ')})"


def unwrap_state_dict(obj) -> Tuple[Dict[str, torch.Tensor], List[Tuple[str, str]]]:
    """The flat name -> Tensor dict inside a loaded checkpoint object, and (name, reason) for
    each entry skipped (metadata such as detectron2's "__author__", non-numeric arrays)."""
    if not isinstance(obj, dict):
        raise ValueError(f"a checkpoint must hold a dict of tensors, got {type(obj).__name__}")
    for container in ("model", "state_dict", "blobs"):
        inner = obj.get(container)
        if isinstance(inner, dict) and inner:
            obj = inner
            break
    tensors, skipped = {}, []
    for name, value in obj.items():
        if not isinstance(name, str):
            skipped.append((reprlib.repr(name), "not a string key"))  # bounded: a key may nest deep
        elif isinstance(value, torch.Tensor):
            tensors[name] = value
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        else:
            skipped.append((name, f"not a tensor ({type(value).__name__})"))
    return tensors, skipped


def load_checkpoint_object(path):
    """The object in a checkpoint file, read safely: the one reader every checkpoint goes through
    (``read_checkpoint`` for weights, the trainer's resume). Every error names the file.

    Its pickles are first judged by type (pickle_scan.py: nothing that allocates by a number in the
    file, nothing unsafe to build); then a zip archive is read by ``torch.load(weights_only=True)``,
    anything else as a numpy-only pickle, or by torch.load when it is not one (a legacy torch file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    obj, not_a_pickle = None, None
    if zipped:  # torch.save's format, read from the file (not held in memory twice)
        check_zip_archive(path, str(path))
        source = str(path)
    else:
        data = path.read_bytes()
        check_pickle_file(data, str(path))
        source = io.BytesIO(data)
        try:
            obj = safe_pickle_load(data)
        except pickle.UnpicklingError as e:
            if "refusing" in str(e) and path.suffix == ".pkl":
                raise pickle.UnpicklingError(f"{path}: {e}") from None
            if "refusing" not in str(e):
                not_a_pickle = e
        except (EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError) as e:
            not_a_pickle = e
    if obj is None or isinstance(obj, int):
        # A legacy torch.save file starts with a pickled magic number, read above as an int.
        try:
            obj = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as e:  # torch.load fails in many ways on files that are not checkpoints
            kind = describe_file(path)
            refused = isinstance(e, pickle.UnpicklingError) and kind.startswith(("a zip archive of", "a Python pickle"))
            if not_a_pickle is not None or not refused:
                raise ValueError(
                    f"{path} is not a checkpoint: it seems to be {kind}; neither torch.load "
                    f"nor pickle can read it ({not_a_pickle or f'{type(e).__name__}: {e}'})"
                ) from None
            raise pickle.UnpicklingError(
                f"{path}: torch.load(weights_only=True) refused it ({e}). A checkpoint must hold only tensors and "
                "plain containers: loading other objects could run arbitrary code. Re-save just the weights, e.g. "
                "torch.save(model.state_dict(), path)"
            ) from None
    return obj


def read_checkpoint(path) -> Tuple[Dict[str, torch.Tensor], List[Tuple[str, str]]]:
    """Read a checkpoint file safely and return (name -> Tensor, skipped entries)."""
    obj = load_checkpoint_object(path)
    try:
        return unwrap_state_dict(obj)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
