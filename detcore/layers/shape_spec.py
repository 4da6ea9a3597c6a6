"""ShapeSpec: what a module knows about a feature map before any image arrives.

Backbones describe their outputs with it (channels and stride); heads read it to size their
layers. Height and width are usually unknown (they depend on the image), hence optional.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ShapeSpec:
    """Static description of a feature map: channels, optional height/width, and the stride
    (in input pixels per feature pixel). Any field may be None when it is not known."""

    channels: Optional[int] = None
    height: Optional[int] = None
    width: Optional[int] = None
    stride: Optional[int] = None
