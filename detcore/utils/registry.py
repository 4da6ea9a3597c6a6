"""Name → object registries, one per component kind (backbones, RPN heads, ROI heads, ...).

Users register their own components with a decorator and select them by name in a config;
a typo gets an error that lists what is registered and the closest name.
"""
import difflib


class Registry:
    """A named table of classes or builder functions.

    >>> BACKBONES = Registry("BACKBONE")
    >>> @BACKBONES.register()
    ... class MyBackbone: ...
    >>> BACKBONES.get("MyBackbone")
    """

    def __init__(self, name):
        self.name = name
        self._table = {}

    def register(self, obj=None, name=None):
        """Register `obj` under `name` (default: its __name__). Usable as a decorator."""

        def add(item):
            key = name or item.__name__
            if key in self._table and self._table[key] is not item:
                raise KeyError(f"{self.name} registry: '{key}' is already registered")
            self._table[key] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name):
        if name not in self._table:
            close = difflib.get_close_matches(str(name), list(self._table), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise KeyError(
                f"No {self.name} named '{name}'.{hint} Registered: {', '.join(sorted(self._table))}"
            )
        return self._table[name]

    def __contains__(self, name):
        return name in self._table

    def names(self):
        return sorted(self._table)

    def __repr__(self):
        return f"Registry({self.name}: {', '.join(sorted(self._table))})"
