"""The contract every backbone keeps with the rest of the model.

A backbone maps a batch of images (N, C, H, W) to a dict of named feature maps, and says ahead
of time what it will return (`output_shape`), so that the RPN and ROI heads can be sized before
any image is seen.
"""
from torch import nn

from detcore.layers.shape_spec import ShapeSpec

__all__ = ["Backbone"]


class Backbone(nn.Module):
    """Base class of backbones.

    Subclasses implement `forward(x) -> dict[str, Tensor]` and either override `output_shape`
    or fill the three attributes it reads: `_out_features` (names, in order),
    `_out_feature_channels` and `_out_feature_strides` (dicts keyed by name).
    """

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__} must implement forward(x)")

    @property
    def size_divisibility(self):
        """Input height and width must be multiples of this (0: no constraint). The data
        pipeline pads batches to it; FPN needs it so that top-down upsampling lines up."""
        return 0

    def output_shape(self):
        """dict: output feature name → ShapeSpec(channels, stride)."""
        return {
            name: ShapeSpec(
                channels=self._out_feature_channels[name], stride=self._out_feature_strides[name]
            )
            for name in self._out_features
        }
