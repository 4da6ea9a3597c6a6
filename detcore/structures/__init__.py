"""Data types passed around the model: boxes, padded image batches, masks, keypoints, per-image instances."""
from .boxes import (
    Boxes,
    clip_limits,
    from_legacy_plus_one,
    pairwise_intersection,
    pairwise_ioa,
    pairwise_iou,
    to_legacy_plus_one,
    xywh_to_xyxy,
    xyxy_to_xywh,
)
from .image_list import ImageList
from .instances import Instances
from .keypoints import Keypoints, flip_indices, heatmaps_to_keypoints, keypoints_to_heatmap, swap_flip_pairs
from .mask_paste import paste_masks_in_image
from .masks import BitMasks, PolygonMasks, polygons_to_bitmask

__all__ = [
    "Boxes",
    "clip_limits",
    "from_legacy_plus_one",
    "to_legacy_plus_one",
    "pairwise_intersection",
    "pairwise_iou",
    "pairwise_ioa",
    "xywh_to_xyxy",
    "xyxy_to_xywh",
    "ImageList",
    "Instances",
    "Keypoints",
    "flip_indices",
    "heatmaps_to_keypoints",
    "keypoints_to_heatmap",
    "swap_flip_pairs",
    "BitMasks",
    "PolygonMasks",
    "polygons_to_bitmask",
    "paste_masks_in_image",
]
