"""Datasets by name: ``DatasetCatalog`` (name -> function returning records) and
``MetadataCatalog`` (name -> ``Metadata``: class names, json file, evaluator type...).

A dataset is registered as a *function*, not as data, so registering is free and nothing is
read from disk until ``DatasetCatalog.get(name)`` is called -- this is what lets the built-in
names (``coco_2017_train``, ``shapes_train``...) exist in every process without costing
anything. A record ("dataset dict") is a plain dict; see ``datasets/coco.py`` for its fields.

A name of the form ``<scheme>:<rest>`` whose scheme is registered with ``register_name_scheme``
(``coco:JSON[:IMAGE_ROOT]`` and ``voc:FOLDER[:SPLIT]``, see ``datasets/data_names.py``) names data
on disk: the first ``DatasetCatalog.get`` or ``MetadataCatalog.get`` of it registers it in both
catalogs, so a config or a command line can name a user's data with no code.
"""
import difflib
import hashlib
import re
from typing import Any, Callable, Dict, List, Tuple

__all__ = [
    "DatasetCatalog", "MetadataCatalog", "Metadata", "DatasetNotRegisteredError", "register_name_scheme",
    "dataset_folder_name",
]


class DatasetNotRegisteredError(KeyError):
    """``DatasetCatalog.get`` with an unknown name. A KeyError, so ``except KeyError`` works."""

    def __str__(self):
        # KeyError would print the message in quotes; show it as a sentence.
        return str(self.args[0]) if self.args else ""


def _unknown_name_message(kind: str, name: str, known: List[str]) -> str:
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    listing = ", ".join(sorted(known)) or "(none)"
    schemes = " or ".join(syntax for _, syntax in _SCHEMES.values())
    own = f". Name your own data as {schemes}" if schemes else ""
    return f"{kind} '{name}' is not registered.{hint} Registered datasets: {listing}{own}"


# scheme -> (function registering a name of that scheme in both catalogs, its syntax for messages).
# The loaders register their schemes (this module must not import them: they import it).
_SCHEMES: Dict[str, Tuple[Callable[[str], None], str]] = {}
_registering: set = set()


def register_name_scheme(scheme: str, register: Callable[[str], None], syntax: str) -> None:
    """Make names ``<scheme>:...`` register themselves on first use: ``register(name)`` is called
    with the whole name and must register it in ``DatasetCatalog`` and ``MetadataCatalog`` (or
    raise, naming what is wrong). ``syntax`` (e.g. ``"coco:JSON[:IMAGE_ROOT]"``) is quoted in
    the error of an unknown name."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", scheme):
        raise ValueError(f"register_name_scheme: scheme must be lowercase letters, digits or '_', got {scheme!r}")
    if scheme in _SCHEMES:
        raise KeyError(f"register_name_scheme: scheme '{scheme}' is already registered")
    _SCHEMES[scheme] = (register, syntax)


def _register_on_first_use(name: str) -> None:
    """Register ``name`` through its scheme when it has one and is not registered yet."""
    if not isinstance(name, str) or name in DatasetCatalog or name in _registering:
        return
    scheme, sep, _ = name.partition(":")
    if not sep or scheme not in _SCHEMES:
        return
    _registering.add(name)  # the scheme's function looks the name up in MetadataCatalog itself
    try:
        _SCHEMES[scheme][0](name)
    finally:
        _registering.discard(name)


def dataset_folder_name(name: str) -> str:
    """A file name standing for dataset ``name`` (its folder under OUTPUT_DIR/inference/): the
    name itself when it is one already, else its characters outside ``[A-Za-z0-9._-]`` replaced
    by '_' (of a long name, its first 20 and last 60 characters) and 8 hex digits of its hash
    appended, so that two names never share a folder (``coco:/data/a/val.json`` ->
    ``coco_data_a_val.json_<hash>``)."""
    if re.fullmatch(r"[A-Za-z0-9._-]+", name) and name not in (".", ".."):
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    if len(safe) > 80:
        safe = f"{safe[:20]}__{safe[-60:]}"
    return f"{safe}_{hashlib.sha256(name.encode('utf-8')).hexdigest()[:8]}"


class _DatasetCatalog:
    """Global name -> loader function table (use the ``DatasetCatalog`` instance)."""

    def __init__(self):
        self._loaders: Dict[str, Callable[[], List[dict]]] = {}

    def register(self, name: str, func: Callable[[], List[dict]]) -> None:
        """Register ``func`` (no arguments, returns a list of records) under ``name``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"DatasetCatalog.register: name must be a non-empty str, got {name!r}")
        if not callable(func):
            raise TypeError(
                f"DatasetCatalog.register('{name}'): func must be callable (returning a list of "
                f"records), got {type(func).__name__}"
            )
        if name in self._loaders:
            raise KeyError(f"DatasetCatalog: dataset '{name}' is already registered")
        self._loaders[name] = func

    def get(self, name: str) -> List[dict]:
        """Call the loader of ``name`` and return its records (a fresh list on every call)."""
        _register_on_first_use(name)
        if name not in self._loaders:
            raise DatasetNotRegisteredError(_unknown_name_message("Dataset", name, list(self._loaders)))
        records = self._loaders[name]()
        if not isinstance(records, list):
            raise TypeError(
                f"DatasetCatalog: the loader of '{name}' must return a list of dicts, got "
                f"{type(records).__name__}"
            )
        return records

    def check_known(self, name: str) -> None:
        """Raise DatasetNotRegisteredError unless ``name`` is registered or is a data name its
        scheme registers now; reads no records (for a check before long work that needs them)."""
        _register_on_first_use(name)
        if name not in self._loaders:
            raise DatasetNotRegisteredError(_unknown_name_message("Dataset", name, list(self._loaders)))

    def list(self) -> List[str]:
        return sorted(self._loaders)

    def remove(self, name: str) -> None:
        if name not in self._loaders:
            raise DatasetNotRegisteredError(_unknown_name_message("Dataset", name, list(self._loaders)))
        del self._loaders[name]

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is registered now (a data name not yet used is not: asking reads nothing)."""
        return name in self._loaders

    def __repr__(self) -> str:
        return f"DatasetCatalog({', '.join(self.list())})"


class Metadata:
    """Attributes describing one dataset: ``thing_classes``, ``json_file``, ``image_root``,
    ``evaluator_type``, ``thing_dataset_id_to_contiguous_id``...

    An attribute, once set, cannot silently change: setting it again to a different value is an
    error (two loaders disagreeing about class names is a bug worth stopping on). A *lazy*
    attribute (``set_lazy``) is computed on every access; the built-in datasets use it for
    paths that depend on the data root or on a cache generated on first use.
    """

    def __init__(self, name: str):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_lazy", {})

    def __getattr__(self, key: str) -> Any:
        # Only reached when normal lookup fails, i.e. for metadata keys (and missing names).
        values = self.__dict__.get("_values", {})
        lazy = self.__dict__.get("_lazy", {})
        if key in values:
            return values[key]
        if key in lazy:
            return lazy[key]()
        known = sorted(set(values) | set(lazy))
        raise AttributeError(f"Metadata of dataset '{self.__dict__.get('name')}' has no '{key}'; it has {known}")

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "name" or key.startswith("_"):
            raise AttributeError(f"Metadata: '{key}' cannot be set")
        if key in self._lazy:
            raise AttributeError(f"Metadata of dataset '{self.name}': '{key}' is computed on access and cannot be set")
        if key in self._values and not _same(self._values[key], value):
            raise ValueError(
                f"Metadata of dataset '{self.name}': '{key}' is already {self._values[key]!r}, "
                f"refusing to change it to {value!r}"
            )
        self._values[key] = value

    def set(self, **kwargs: Any) -> "Metadata":
        for key, value in kwargs.items():
            setattr(self, key, value)
        return self

    def set_lazy(self, key: str, func: Callable[[], Any]) -> "Metadata":
        """Make ``key`` call ``func()`` on each access."""
        if key in self._values:
            raise ValueError(f"Metadata of dataset '{self.name}': '{key}' is already set")
        self._lazy[key] = func
        return self

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            return default

    def has(self, key: str) -> bool:
        return key in self._values or key in self._lazy

    def as_dict(self) -> Dict[str, Any]:
        """All attributes (lazy ones evaluated now), plus ``name``."""
        out = {"name": self.name}
        out.update(self._values)
        out.update({k: f() for k, f in self._lazy.items()})
        return out

    def __repr__(self) -> str:
        keys = sorted(set(self._values) | set(self._lazy))
        return f"Metadata(name='{self.name}', keys={keys})"


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. numpy arrays: truth value is ambiguous
        return a is b


class _MetadataCatalog:
    """Global name -> ``Metadata`` table (use the ``MetadataCatalog`` instance). ``get`` creates
    an empty ``Metadata`` the first time a name is asked for, as in detectron2."""

    def __init__(self):
        self._table: Dict[str, Metadata] = {}

    def get(self, name: str) -> Metadata:
        _register_on_first_use(name)
        if name not in self._table:
            self._table[name] = Metadata(name)
        return self._table[name]

    def list(self) -> List[str]:
        return sorted(self._table)

    def remove(self, name: str) -> None:
        self._table.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._table


DatasetCatalog = _DatasetCatalog()
MetadataCatalog = _MetadataCatalog()
