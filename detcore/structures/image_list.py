"""A batch of differently sized images padded into one tensor, remembering each true size."""
import numbers
from typing import List, Sequence, Tuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["ImageList", "padded_side", "size_int"]


class ImageList:
    """``tensor``: ``[B, C, H, W]`` padded batch; ``image_sizes``: the ``(h, w)`` of each image
    before padding (image ``i`` lives in ``tensor[i, :, :h, :w]``).

    The model needs the true sizes to clip boxes and to ignore anchors in the padding.
    """

    def __init__(self, tensor: torch.Tensor, image_sizes: Sequence[Tuple[int, int]]):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"ImageList: tensor must be [B, C, H, W], got {shape}")
        if len(image_sizes) != tensor.shape[0]:
            raise ValueError(
                f"ImageList: got {len(image_sizes)} image_sizes for a batch of {tensor.shape[0]} images"
            )
        sizes = []
        for i, size in enumerate(image_sizes):
            if len(size) != 2:
                raise ValueError(f"ImageList: image_sizes[{i}] must be (h, w), got {size!r}")
            h, w = size_int(size[0]), size_int(size[1])
            if statically_known_true(h < 0) or statically_known_true(h > tensor.shape[2]) or statically_known_true(w < 0) or statically_known_true(w > tensor.shape[3]):
                raise ValueError(
                    f"ImageList: image_sizes[{i}] = {(h, w)} does not fit in the padded "
                    f"{tuple(tensor.shape[2:])} tensor"
                )
            sizes.append((h, w))
        self.tensor = tensor
        self.image_sizes: List[Tuple[int, int]] = sizes

    def __len__(self) -> int:
        return len(self.image_sizes)

    def __getitem__(self, idx: int) -> torch.Tensor:
        """Image ``idx`` without its padding, ``[C, h, w]`` (a view)."""
        if not isinstance(idx, numbers.Integral):
            raise TypeError(f"ImageList: index must be an int, got {type(idx).__name__}")
        h, w = self.image_sizes[idx]
        return self.tensor[idx, :, :h, :w]

    def to(self, *args, **kwargs) -> "ImageList":
        """Same arguments as ``torch.Tensor.to``; returns a new ImageList."""
        return ImageList(self.tensor.to(*args, **kwargs), self.image_sizes)

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def __repr__(self) -> str:
        return f"ImageList(tensor={tuple(self.tensor.shape)}, image_sizes={self.image_sizes})"

    @staticmethod
    def from_tensors(
        tensors: Sequence[torch.Tensor], size_divisibility: int = 32, pad_value: float = 0.0
    ) -> "ImageList":
        """Pad ``[C, Hi, Wi]`` images to a common ``[C, H, W]`` and stack them.

        ``H`` and ``W`` are the largest height and width rounded up to a multiple of
        ``size_divisibility`` (FPN needs every level's stride to divide the input; 0 or 1
        disables the rounding). Padding goes to the bottom and right, filled with ``pad_value``.
        """
        if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
            raise ValueError("ImageList.from_tensors: tensors must be a non-empty list of [C, H, W] tensors")
        first = tensors[0]
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"ImageList.from_tensors: tensors[{i}] must be [C, H, W], got {shape}")
            if t.shape[0] != first.shape[0] or t.dtype != first.dtype or t.device != first.device:
                raise ValueError(
                    f"ImageList.from_tensors: tensors[{i}] is {t.shape[0]} channels {t.dtype} on {t.device}, "
                    f"but tensors[0] is {first.shape[0]} channels {first.dtype} on {first.device}"
                )
        image_sizes = [(size_int(t.shape[1]), size_int(t.shape[2])) for t in tensors]
        if len(tensors) == 1:
            max_h, max_w = image_sizes[0]
        else:
            max_h = max(h for h, _ in image_sizes)
            max_w = max(w for _, w in image_sizes)
        max_h = padded_side(max_h, size_divisibility)
        max_w = padded_side(max_w, size_divisibility)
        padded = [
            torch.nn.functional.pad(t, (0, max_w - t.shape[2], 0, max_h - t.shape[1]), value=pad_value)
            for t in tensors
        ]
        return ImageList(torch.stack(padded), image_sizes)


def size_int(value):
    """An image side as an int; a symbolic one (traced with dynamic image sizes for export) stays
    symbolic, so the graph works for every size."""
    return value if isinstance(value, torch.SymInt) else int(value)


def padded_side(size, divisibility: int):
    """An image side rounded up to a multiple of `divisibility` (0 or 1: unchanged). Written as
    size + (-size) % d: a tracer can then prove the padding is >= 0."""
    return size + (-size) % divisibility if divisibility > 1 else size
