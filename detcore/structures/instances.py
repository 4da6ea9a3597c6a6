"""``Instances``: the per-image bag of equally long fields that flows through the model.

Ground truth arrives as ``gt_boxes`` / ``gt_classes`` / ``gt_masks``; the RPN emits
``proposal_boxes`` / ``objectness_logits``; the ROI heads emit ``pred_boxes`` / ``scores`` /
``pred_classes`` / ``pred_masks``. Every field holds one entry per instance, so one index
(a bool mask, an index tensor, a slice) selects the same instances in all of them.
"""
import numbers
from typing import Any, Dict, List, Tuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .image_list import size_int

__all__ = ["Instances"]


class Instances:
    """Fields are set as attributes (``inst.scores = s``) or with ``set``; a field can be any
    object with ``__len__`` and ``__getitem__`` (tensors, ``Boxes``, masks, lists).

    Setting a field whose length differs from the existing ones raises a ``ValueError`` that
    names the field and both lengths, which catches most per-image bookkeeping bugs early.
    """

    def __init__(self, image_size: Tuple[int, int], **fields: Any):
        if len(image_size) != 2:
            raise ValueError(f"Instances: image_size must be (height, width), got {image_size!r}")
        self._image_size = (size_int(image_size[0]), size_int(image_size[1]))
        self._fields: Dict[str, Any] = {}
        for name, value in fields.items():
            self.set(name, value)

    @property
    def image_size(self) -> Tuple[int, int]:
        """``(height, width)`` of the image these instances belong to."""
        return self._image_size

    # --- field access -------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self.set(name, value)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, i.e. for fields (and for missing names).
        fields = self.__dict__.get("_fields")
        if fields is None or name not in fields:
            available = sorted(fields) if fields else []
            raise AttributeError(f"Instances has no field '{name}'; fields are {available}")
        return fields[name]

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            super().__delattr__(name)
        else:
            self.remove(name)

    def set(self, name: str, value: Any) -> None:
        if name == "image_size" or name.startswith("_"):
            raise ValueError(f"Instances: '{name}' cannot be used as a field name")
        try:
            length = _length(value)
        except TypeError:
            raise TypeError(
                f"Instances: field '{name}' must have a length (tensor, Boxes, list...), got "
                f"{type(value).__name__}"
            ) from None
        # All existing fields share one length, so comparing with one other field is enough.
        # (Traced with a data-dependent count, lengths not provably different pass.)
        other = next((n for n in self._fields if n != name), None)
        if other is not None and statically_known_true(_length(self._fields[other]) != length):
            raise ValueError(
                f"Instances: field '{name}' has length {length} but field '{other}' has length "
                f"{_length(self._fields[other])}"
            )
        self._fields[name] = value

    def get(self, name: str) -> Any:
        return getattr(self, name)

    def has(self, name: str) -> bool:
        return name in self._fields

    def remove(self, name: str) -> None:
        if name not in self._fields:
            raise KeyError(f"Instances has no field '{name}'; fields are {sorted(self._fields)}")
        del self._fields[name]

    def fields(self) -> Dict[str, Any]:
        """A new dict of name -> value (editing the dict does not change the Instances)."""
        return dict(self._fields)

    # --- container protocol -------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.num_instances())

    def num_instances(self):
        """``len(self)``, but symbolic where the count is (tracing for export): len() must
        return a Python int. No fields yet: no instances known, 0 keeps loops and filters simple."""
        for value in self._fields.values():
            return _length(value)
        return 0

    def __getitem__(self, item) -> "Instances":
        """Index every field with ``item``; an int keeps the instance dimension (length 1)."""
        if isinstance(item, numbers.Integral):
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"Instances index {item} out of range for {n} instances")
            item = int(item) % n
            item = slice(item, item + 1)
        out = Instances(self._image_size)
        for name, value in self._fields.items():
            if isinstance(value, list):
                out.set(name, _index_list(value, item))
            else:
                out.set(name, value[item])
        return out

    def to(self, device) -> "Instances":
        """A new Instances with every field that has ``.to`` moved to ``device``."""
        out = Instances(self._image_size)
        for name, value in self._fields.items():
            out.set(name, value.to(device) if hasattr(value, "to") else value)
        return out

    @staticmethod
    def cat(instance_lists: List["Instances"]) -> "Instances":
        """Concatenate Instances of one image (same ``image_size``, same field names)."""
        if not isinstance(instance_lists, (list, tuple)) or len(instance_lists) == 0:
            raise ValueError("Instances.cat: expected a non-empty list of Instances")
        first = instance_lists[0]
        for i, inst in enumerate(instance_lists):
            if not isinstance(inst, Instances):
                raise TypeError(f"Instances.cat: element {i} is {type(inst).__name__}, not Instances")
            if inst.image_size != first.image_size:
                raise ValueError(
                    f"Instances.cat: element {i} has image_size {inst.image_size}, element 0 has "
                    f"{first.image_size}"
                )
            if set(inst._fields) != set(first._fields):
                raise ValueError(
                    f"Instances.cat: element {i} has fields {sorted(inst._fields)}, element 0 has "
                    f"{sorted(first._fields)}"
                )
        if len(instance_lists) == 1:
            return first
        out = Instances(first.image_size)
        for name, value in first._fields.items():
            values = [inst._fields[name] for inst in instance_lists]
            if isinstance(value, torch.Tensor):
                merged = torch.cat(values, dim=0)
            elif isinstance(value, list):
                merged = [x for v in values for x in v]
            elif hasattr(type(value), "cat"):
                merged = type(value).cat(values)
            else:
                raise TypeError(f"Instances.cat: field '{name}' of type {type(value).__name__} cannot be concatenated")
            out.set(name, merged)
        return out

    def __repr__(self) -> str:
        parts = [f"{name}: {_describe(value)}" for name, value in self._fields.items()]
        h, w = self._image_size
        return (
            f"Instances(num_instances={len(self)}, image_height={h}, image_width={w}, "
            f"fields=[{', '.join(parts)}])"
        )


def _describe(value: Any) -> str:
    """Short summary of a field for repr: shapes and dtypes, not thousands of numbers."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        device = "" if value.device.type == "cpu" else f", {value.device}"
        return f"Tensor{list(value.shape)} {dtype}{device}"
    if isinstance(value, list):
        return f"list[{len(value)}]"
    return f"{type(value).__name__}[{len(value)}]"


def _index_list(values: list, item) -> list:
    """Index a Python list the way a tensor would be indexed along dim 0."""
    if isinstance(item, slice):
        return values[item]
    if isinstance(item, torch.Tensor):
        if item.dtype == torch.bool:
            if item.shape != (len(values),):
                raise IndexError(f"bool index of shape {tuple(item.shape)} for a list of length {len(values)}")
            item = item.nonzero().flatten()
        return [values[i] for i in item.tolist()]
    if isinstance(item, (list, tuple)):
        if item and all(isinstance(x, bool) for x in item):
            return _index_list(values, torch.tensor(item, dtype=torch.bool))
        return [values[i] for i in item]
    raise TypeError(f"cannot index a list field with {type(item).__name__}")


def _length(value):
    """A field's length; for tensors (and Boxes) the size itself, which stays symbolic when traced."""
    if isinstance(value, torch.Tensor):
        return value.shape[0]
    tensor = getattr(value, "tensor", None)
    if isinstance(tensor, torch.Tensor):
        return tensor.shape[0]
    return len(value)
