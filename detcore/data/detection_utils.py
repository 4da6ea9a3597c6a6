"""Helpers between records and model inputs: reading images, moving annotations through
transforms, and turning them into ``Instances`` (gt_boxes / gt_classes / gt_masks / gt_keypoints)."""
import io
import os
from typing import List, Optional, Sequence, Tuple

import cv2
import numpy as np
import pycocotools.mask as mask_util
import torch

from detcore.config.choices import IMAGE_FORMATS, MASK_FORMATS

from ..structures import BitMasks, Boxes, Instances, Keypoints, PolygonMasks, flip_indices, polygons_to_bitmask
from .catalog import MetadataCatalog
from .transforms import TransformList, mirrors

__all__ = [
    "read_image",
    "check_image_size",
    "mask_to_polygons",
    "transform_instance_annotations",
    "transform_keypoint_annotations",
    "keypoint_flip_indices",
    "annotations_to_instances",
    "filter_empty_instances",
]

_FORMATS = IMAGE_FORMATS


def read_image(file_name: str, format: str = "BGR") -> np.ndarray:
    """``[H, W, 3]`` uint8 image in ``format`` channel order ("BGR" or "RGB"), read with OpenCV
    (grayscale images are expanded to 3 channels, alpha is dropped)."""
    if format not in _FORMATS:
        raise ValueError(f"read_image: format must be one of {_FORMATS}, got {format!r}")
    if not os.path.isfile(file_name):
        raise FileNotFoundError(f"image file not found: {file_name}")
    data = np.fromfile(file_name, dtype=np.uint8)
    if _is_truncated_jpeg(data.tobytes()):
        # libjpeg may fill the missing rows with grey, printing a warning without the file name.
        raise OSError(f"image file {file_name} is a truncated JPEG (it ends before its end-of-image marker)")
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if image is None:
        raise OSError(f"could not read image file {file_name} (unreadable or not an image)")
    if format == "RGB":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return image


def _is_truncated_jpeg(data: bytes) -> bool:
    """A JPEG whose data stops before its end-of-image marker (FF D9). Files that merely carry
    bytes after the marker are told apart by decoding them with Pillow, when it is installed."""
    if not data.startswith(b"\xff\xd8") or data.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
        return False
    try:
        from PIL import Image
    except ImportError:
        return True
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # raises on a truncated file (ImageFile.LOAD_TRUNCATED_IMAGES is off)
    except OSError:
        return True
    return False


def check_image_size(record: dict, image: np.ndarray) -> None:
    """The image read must have the size the annotations were made for."""
    h, w = image.shape[:2]
    if (record.get("height", h), record.get("width", w)) != (h, w):
        raise ValueError(
            f"{record.get('file_name')}: the image is {h}x{w} (HxW) but its record says "
            f"{record.get('height')}x{record.get('width')}"
        )


# Upsampling factor of the contour tracing in mask_to_polygons; the polygons lie 1 / (2 * k)
# pixel inside the true outline.
_TRACE_UPSAMPLE = 4


def mask_to_polygons(mask: np.ndarray) -> List[List[float]]:
    """Polygons (flat ``[x0, y0, ...]`` lists, one per connected part) tracing a ``[H, W]``
    binary mask, such that rasterizing them (pixel set when its center is inside) gives back the
    mask exactly -- for masks without holes; a hole is filled, as polygons cannot express it.

    The contour is traced on the mask upsampled k = 4 times: its vertices are then centers of
    sub-pixels, 1/8 pixel inside the true outline, so every pixel center of the mask is strictly
    inside and every other one strictly outside. (Tracing the mask itself would put the outer
    pixel centers exactly on the polygon, where rasterization is a coin flip; a larger k keeps
    the polygon closer to the outline, which matters once the image is upscaled.)
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask_to_polygons: mask must be [H, W], got shape {mask.shape}")
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        return []
    # Trace only the box around the mask: the upsampled copy stays small.
    y0, x0 = rows[0], cols[0]
    crop = mask[y0 : rows[-1] + 1, x0 : cols[-1] + 1].astype(np.uint8)
    k = _TRACE_UPSAMPLE
    up = np.pad(np.repeat(np.repeat(crop, k, axis=0), k, axis=1), 1)  # pad: contours never touch the border
    contours, _ = cv2.findContours(up, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polygons = []
    for c in contours:
        pts = (c.reshape(-1, 2).astype(np.float64) - 1 + 0.5) / k + (x0, y0)
        if len(pts) >= 3:  # always true for an upsampled mask, kept as a guard
            polygons.append(pts.reshape(-1).tolist())
    return polygons


def _decode_rle(segm: dict) -> np.ndarray:
    h, w = segm["size"]
    if isinstance(segm["counts"], list):  # uncompressed RLE
        segm = mask_util.frPyObjects(segm, h, w)
    return mask_util.decode(segm).astype(bool)


def transform_keypoint_annotations(
    keypoints: Sequence[float],
    transforms: TransformList,
    image_size: Tuple[int, int],
    flip_indices: Optional[Sequence[int]] = None,
) -> np.ndarray:
    """One instance's keypoints (flat ``[x1, y1, v1, ...]`` or ``[K, 3]``) after ``transforms``,
    as a ``[K, 3]`` float64 array in the new image of ``image_size`` (h, w).

    Points move through the transforms' point map (``apply_coords``), like boxes and polygons.
    A labeled point that lands outside the image becomes unlabeled, and unlabeled points are
    (0, 0, 0), as in COCO. When the transforms mirror the image (``transforms.mirrors``), each
    point also takes its mirror partner's name: row ``i`` becomes old row ``flip_indices[i]``
    (structures.flip_indices of the dataset's keypoint_flip_map), the left/right swap."""
    kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, 3)
    xy = transforms.apply_coords(kp[:, :2])
    h, w = image_size
    inside = (xy[:, 0] >= 0) & (xy[:, 0] <= w) & (xy[:, 1] >= 0) & (xy[:, 1] <= h)
    keep = (kp[:, 2] > 0) & inside
    out = np.zeros_like(kp)
    out[keep, :2] = xy[keep]
    out[keep, 2] = kp[keep, 2]
    if mirrors(transforms):
        if flip_indices is None:
            raise ValueError(
                "the transforms mirror the image, so left/right keypoints must swap, but no flip indices were "
                "given (the dataset's metadata needs keypoint_names and keypoint_flip_map)"
            )
        if len(flip_indices) != len(out):
            raise ValueError(f"keypoints: {len(out)} points, but the flip indices are for {len(flip_indices)}")
        out = out[np.asarray(flip_indices, dtype=np.int64)]
    return out


def keypoint_flip_indices(dataset_names: Sequence[str], num_keypoints: Optional[int] = None) -> List[int]:
    """The flip indices (see ``transform_keypoint_annotations``) of the named datasets, from
    their metadata (keypoint_names, keypoint_flip_map); all of them must agree, and with
    ``num_keypoints`` (the model's K) they must have that many names."""
    found = None
    for name in dataset_names:
        meta = MetadataCatalog.get(name)
        names = meta.get("keypoint_names")
        if not names:
            raise ValueError(
                f"dataset '{name}' has no keypoint_names in its metadata: it is not a keypoint dataset (or "
                "its COCO json has not been loaded yet), so keypoints cannot be trained on it"
            )
        if num_keypoints is not None and len(names) != num_keypoints:
            raise ValueError(
                f"dataset '{name}' has {len(names)} keypoints {list(names)}, but MODEL.ROI_KEYPOINT_HEAD."
                f"NUM_KEYPOINTS is {num_keypoints}"
            )
        indices = flip_indices(names, meta.get("keypoint_flip_map", []))
        if found is not None and indices != found[1]:
            raise ValueError(f"datasets '{found[0]}' and '{name}' have different keypoint names or flip maps")
        found = (name, indices)
    if found is None:
        raise ValueError("keypoint_flip_indices: no dataset names given")
    return found[1]


def transform_instance_annotations(
    anno: dict, transforms: TransformList, image_size: Tuple[int, int], keypoint_flip_indices: Optional[Sequence[int]] = None
) -> dict:
    """A new annotation with its box (clipped to the new image), segmentation and keypoints moved by
    ``transforms``. Polygons stay polygons; an RLE becomes a ``[H, W]`` bool array; keypoints
    become a ``[K, 3]`` array (see ``transform_keypoint_annotations``)."""
    h, w = image_size
    out = dict(anno)
    box = transforms.apply_box(np.asarray([anno["bbox"]], dtype=np.float64))[0]
    out["bbox"] = np.minimum(np.maximum(box, 0), [w, h, w, h]).tolist()
    if "segmentation" in anno:
        segm = anno["segmentation"]
        if isinstance(segm, dict):
            out["segmentation"] = transforms.apply_segmentation(_decode_rle(segm))
        else:
            polygons = transforms.apply_polygons([np.asarray(p, dtype=np.float64) for p in segm])
            out["segmentation"] = [p.tolist() for p in polygons]
    if "keypoints" in anno:
        out["keypoints"] = transform_keypoint_annotations(anno["keypoints"], transforms, image_size, keypoint_flip_indices)
    return out


def annotations_to_instances(
    annos: Sequence[dict],
    image_size: Tuple[int, int],
    mask_format: str = "polygon",
    with_masks: bool = True,
    with_keypoints: bool = False,
    num_keypoints: int = 0,
) -> Instances:
    """``Instances`` with gt_boxes (clipped), gt_classes (int64), when ``with_masks`` gt_masks as
    ``PolygonMasks`` (``mask_format="polygon"``) or ``BitMasks`` ("bitmask"), and when
    ``with_keypoints`` gt_keypoints (``Keypoints`` of the annotations' ``[K, 3]`` keypoints;
    ``num_keypoints`` is K for an image without annotations)."""
    if mask_format not in MASK_FORMATS:
        raise ValueError(f"annotations_to_instances: mask_format must be one of {list(MASK_FORMATS)}, got {mask_format!r}")
    h, w = image_size
    boxes = Boxes(torch.tensor([a["bbox"] for a in annos], dtype=torch.float32).reshape(-1, 4)).clip((h, w))
    classes = torch.tensor([a["category_id"] for a in annos], dtype=torch.int64)
    instances = Instances((h, w), gt_boxes=boxes, gt_classes=classes)
    if with_keypoints:
        instances.gt_keypoints = _keypoints_of(annos, num_keypoints)
    if not with_masks:
        return instances
    segms = []
    for a in annos:
        if "segmentation" not in a:
            raise ValueError(
                f"annotation {a.get('id', '?')} has no 'segmentation' but instance masks were asked for "
                "(MODEL.MASK_ON): the dataset must provide masks"
            )
        segms.append(a["segmentation"])
    if mask_format == "polygon":
        # An RLE (decoded to an array by the transforms) is traced into polygons.
        polys = [mask_to_polygons(s) if isinstance(s, np.ndarray) else s for s in segms]
        instances.gt_masks = PolygonMasks(polys)
    else:
        bitmaps = [
            torch.from_numpy(np.ascontiguousarray(s, dtype=bool))
            if isinstance(s, np.ndarray)
            else polygons_to_bitmask(s, h, w)
            for s in segms
        ]
        for a, b in zip(annos, bitmaps):
            if tuple(b.shape) != (h, w):
                raise ValueError(f"annotation {a.get('id', '?')}: mask is {tuple(b.shape)}, image is {(h, w)}")
        instances.gt_masks = BitMasks(torch.stack(bitmaps) if bitmaps else torch.zeros((0, h, w), dtype=torch.bool))
    return instances


def _keypoints_of(annos: Sequence[dict], num_keypoints: int) -> Keypoints:
    arrays = []
    for a in annos:
        if "keypoints" not in a:
            raise ValueError(
                f"annotation {a.get('id', '?')} has no 'keypoints' but keypoints were asked for "
                "(MODEL.KEYPOINT_ON): the dataset must provide them"
            )
        kp = np.asarray(a["keypoints"], dtype=np.float32).reshape(-1, 3)
        if arrays and kp.shape != arrays[0].shape:
            raise ValueError(
                f"annotation {a.get('id', '?')} has {len(kp)} keypoints where annotation "
                f"{annos[0].get('id', '?')} has {len(arrays[0])}"
            )
        arrays.append(kp)
    if not arrays:
        return Keypoints(torch.zeros((0, num_keypoints, 3)))
    return Keypoints(torch.from_numpy(np.stack(arrays)))


def filter_empty_instances(instances: Instances, box_threshold: float = 1e-5) -> Instances:
    """Drop instances whose box is (nearly) empty or whose mask is empty, e.g. boxes lying
    outside the image after clipping, or zero-width boxes from the json."""
    if len(instances) == 0:
        return instances
    keep = instances.gt_boxes.nonempty(threshold=box_threshold)
    if instances.has("gt_masks"):
        keep &= instances.gt_masks.nonempty()
    return instances[keep]
