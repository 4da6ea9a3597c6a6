"""Name → class registries, one per component kind, and the one rule for building a component.

The rule (docs/adding_a_component.md):

- a component's ``__init__`` takes plain arguments (channels, strides, thresholds, sub-modules);
- its classmethod ``from_config(cfg, *args)`` returns the dict of those arguments, read from the
  config (``args`` are what the caller knows and the config does not, e.g. input shapes);
- ``build_from_config(cls, cfg, *args)`` calls both; ``registry.build(cfg, *args)`` first looks
  the class up by the name in the registry's config key.

A subclass changes one argument by overriding ``from_config`` and editing the parent's dict.
A typo in a name gets an error that lists what is registered and the closest name.
"""
import difflib
from collections.abc import Mapping

__all__ = ["Registry", "build_from_config"]


def build_from_config(cls, cfg, *args, **kwargs):
    """``cls(**cls.from_config(cfg, *args, **kwargs))``, with errors that name the class."""
    from_config = getattr(cls, "from_config", None)
    if not callable(from_config):
        raise TypeError(
            f"{_qualname(cls)} has no from_config classmethod; a component built from a config needs "
            "one that returns the dict of its constructor arguments (see docs/adding_a_component.md)"
        )
    arguments = from_config(cfg, *args, **kwargs)
    if not isinstance(arguments, Mapping):
        raise TypeError(
            f"{_qualname(cls)}.from_config must return a dict of constructor arguments, got "
            f"{type(arguments).__name__} (see docs/adding_a_component.md)"
        )
    return cls(**arguments)


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry:
    """A named table of component classes, selected by the config key ``config_key``.

    >>> BACKBONES = Registry("BACKBONE", "MODEL.BACKBONE.NAME")
    >>> @BACKBONES.register()
    ... class MyBackbone(Backbone):
    ...     def __init__(self, *, depth): ...
    ...     @classmethod
    ...     def from_config(cls, cfg, input_shape):
    ...         return {"depth": cfg.MODEL.RESNETS.DEPTH}
    >>> BACKBONES.build(cfg, input_shape)   # the class named by cfg.MODEL.BACKBONE.NAME
    """

    def __init__(self, name: str, config_key: str):
        self.name = name
        self.config_key = config_key
        self._table = {}
        self._aliases = {}

    def register(self, obj=None, name=None):
        """Register class ``obj`` under ``name`` (default: its __name__). Usable as a decorator.
        The class must have a ``from_config`` classmethod (the one rule, module docstring)."""

        def add(item):
            key = name or item.__name__
            if not isinstance(item, type) or not callable(getattr(item, "from_config", None)):
                raise TypeError(
                    f"{self.name} registry: '{key}' must be a class with a from_config classmethod "
                    "returning its constructor arguments (see docs/adding_a_component.md)"
                )
            if (key in self._table and self._table[key] is not item) or key in self._aliases:
                raise KeyError(f"{self.name} registry: '{key}' is already registered")
            self._table[key] = item
            return item

        return add if obj is None else add(obj)

    def register_alias(self, alias: str, name: str) -> None:
        """Let ``alias`` select the class registered as ``name`` (e.g. detectron2's spelling)."""
        if alias in self._table or alias in self._aliases:
            raise KeyError(f"{self.name} registry: '{alias}' is already registered")
        self.get(name)  # must exist
        self._aliases[alias] = self._aliases.get(name, name)  # an alias of an alias: the class's name

    def get(self, name):
        name = self._aliases.get(name, name)
        if name not in self._table:
            close = difflib.get_close_matches(str(name), list(self._table) + list(self._aliases), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise KeyError(
                f"No {self.name} named '{name}' (config key {self.config_key}).{hint} "
                f"Registered: {', '.join(sorted(self._table))}"
            )
        return self._table[name]

    def selected_name(self, cfg) -> str:
        """The name the config selects: the value of ``config_key``."""
        node = cfg
        for part in self.config_key.split("."):
            node = node[part]
        return node

    def build(self, cfg, *args, **kwargs):
        """Build the class that ``cfg`` selects (see ``build_from_config``)."""
        return build_from_config(self.get(self.selected_name(cfg)), cfg, *args, **kwargs)

    def __contains__(self, name):
        return name in self._table or name in self._aliases

    def names(self):
        """The registered names (aliases not included)."""
        return sorted(self._table)

    def aliases(self):
        return dict(self._aliases)

    def __repr__(self):
        return f"Registry({self.name} by {self.config_key}: {', '.join(sorted(self._table))})"
