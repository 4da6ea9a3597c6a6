"""detcore's layers: the compiled ops (NMS, ROIAlign, ROIPool, deformable convolution, sigmoid focal
loss) and the model's building blocks.

The ops need only torch and detcore._C at run time (no torchvision).
"""
from ._extension import OpArgumentError
from .batch_norm import FrozenBatchNorm2d, get_norm
from .conv import Conv2d, c2_msra_fill, c2_xavier_fill
from .deform_conv import DeformConv2d, deform_conv2d
from .focal_loss import sigmoid_focal_loss, sigmoid_focal_loss_per_image
from .nms import batched_nms, nms
from .roi_align import ROIAlign, RoIAlign, roi_align
from .roi_pool import ROIPool, RoIPool, roi_pool
from .shape_spec import ShapeSpec
from .value_checks import trusted_inputs, value_checks_enabled

__all__ = [
    "OpArgumentError",
    "nms",
    "batched_nms",
    "roi_align",
    "ROIAlign",
    "RoIAlign",
    "roi_pool",
    "ROIPool",
    "RoIPool",
    "deform_conv2d",
    "DeformConv2d",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_per_image",
    "FrozenBatchNorm2d",
    "get_norm",
    "Conv2d",
    "c2_msra_fill",
    "c2_xavier_fill",
    "ShapeSpec",
    "trusted_inputs",
    "value_checks_enabled",
]
