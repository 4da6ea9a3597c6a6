"""JSON that every parser reads: non-finite numbers become null.

Python's json writes NaN and Infinity as bare tokens, which are not JSON: strict parsers
(JavaScript's, jq, most other languages') reject the whole file. Every JSON file detcore
writes goes through ``dumps`` here.
"""
import json
import math
from typing import Any

__all__ = ["dumps", "finite_or_none"]


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (at any depth of dicts, lists and tuples) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / torch scalars
        return finite_or_none(obj.item())
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """``json.dumps`` of ``finite_or_none(obj)``; refuses NaN / Infinity (there are none left)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
