import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from detcore.data import annotations_to_instances, filter_empty_instances, mask_to_polygons, read_image
from detcore.structures import BitMasks, PolygonMasks

from .files import write_png


def random_mask(rng, h, w):
    mask = np.zeros((h, w), dtype=np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        if rng.random() < 0.5:
            center = (int(rng.integers(0, w * 16)), int(rng.integers(0, h * 16)))
            cv2.circle(mask, center, int(rng.integers(8, 16 * 12)), 1, -1, cv2.LINE_8, 4)
        else:
            pts = (rng.uniform(0, 1, (int(rng.integers(3, 6)), 2)) * [w * 16, h * 16]).astype(np.int32)
            cv2.fillPoly(mask, [pts], 1, cv2.LINE_8, 4)
    if rng.random() < 0.3:
        mask &= (rng.random((h, w)) < 0.8).astype(np.uint8)  # ragged: diagonal-only contacts, specks
    return mask


def has_hole(mask):
    _, hierarchy = cv2.findContours(mask, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    return hierarchy is not None and (hierarchy[0][:, 3] >= 0).any()


def test_mask_to_polygons_round_trips_exactly():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        h, w = (int(v) for v in rng.integers(4, 40, size=2))
        mask = random_mask(rng, h, w)
        polys = mask_to_polygons(mask)
        if not mask.any():
            assert polys == []
            continue
        decoded = mask_util.decode(mask_util.merge(mask_util.frPyObjects(polys, h, w)))
        if has_hole(mask):
            assert (decoded >= mask).all()  # holes are filled, nothing is lost
        else:
            assert np.array_equal(decoded, mask)
            checked += 1
    assert checked > 200


def test_mask_to_polygons_separate_parts():
    mask = np.zeros((10, 10), dtype=np.uint8)
    mask[1:3, 1:3] = 1
    mask[6:9, 5:9] = 1
    polys = sorted(mask_to_polygons(mask), key=lambda p: p[0])
    assert len(polys) == 2
    xs, ys = np.array(polys[0][0::2]), np.array(polys[0][1::2])
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (1.125, 2.875, 1.125, 2.875)  # 1/8 pixel inside


def test_read_image_formats(tmp_path):
    bgr = write_png(tmp_path / "x.png", 5, 7)
    assert np.array_equal(read_image(str(tmp_path / "x.png")), bgr)
    assert np.array_equal(read_image(str(tmp_path / "x.png"), "RGB"), bgr[:, :, ::-1])
    cv2.imwrite(str(tmp_path / "gray.png"), bgr[:, :, 0])
    assert read_image(str(tmp_path / "gray.png")).shape == (5, 7, 3)
    with pytest.raises(ValueError, match="format"):
        read_image(str(tmp_path / "x.png"), "YUV")


def test_annotations_to_instances_formats():
    annos = [
        {"bbox": [1.0, 2.0, 5.0, 6.0], "category_id": 2, "segmentation": [[1, 2, 5, 2, 5, 6, 1, 6]]},
        {"bbox": [-3.0, 0.0, 30.0, 4.0], "category_id": 0, "segmentation": [[0, 0, 10, 0, 10, 4]]},
    ]
    inst = annotations_to_instances(annos, (8, 10), "polygon")
    assert inst.image_size == (8, 10)
    assert inst.gt_boxes.tensor.tolist() == [[1, 2, 5, 6], [0, 0, 10, 4]]  # clipped
    assert inst.gt_classes.dtype == torch.int64 and inst.gt_classes.tolist() == [2, 0]
    assert isinstance(inst.gt_masks, PolygonMasks)
    bit = annotations_to_instances(annos, (8, 10), "bitmask")
    assert isinstance(bit.gt_masks, BitMasks) and bit.gt_masks.tensor.shape == (2, 8, 10)
    assert bit.gt_masks.tensor[0].sum() == 16
    assert not annotations_to_instances(annos, (8, 10), with_masks=False).has("gt_masks")
    empty = annotations_to_instances([], (8, 10), "bitmask")
    assert len(empty) == 0 and empty.gt_masks.tensor.shape == (0, 8, 10)
    with pytest.raises(ValueError, match="annotation 9 has no 'segmentation'"):
        annotations_to_instances([{"id": 9, "bbox": [0, 0, 1, 1], "category_id": 0}], (8, 10))


def test_filter_empty_instances():
    annos = [
        {"bbox": [1.0, 1.0, 1.0, 5.0], "category_id": 0},  # zero width
        {"bbox": [1.0, 1.0, 4.0, 5.0], "category_id": 1},
        {"bbox": [20.0, 1.0, 30.0, 5.0], "category_id": 2},  # outside: empty once clipped
    ]
    inst = filter_empty_instances(annotations_to_instances(annos, (8, 10), with_masks=False))
    assert inst.gt_classes.tolist() == [1]
