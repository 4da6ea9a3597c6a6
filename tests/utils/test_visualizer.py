import numpy as np
import pytest
import torch

from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks
from detcore.utils.visualizer import class_color, draw_instances


def gradient_image(h=128, w=128):
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    img[..., 1] = np.linspace(255, 0, h, dtype=np.uint8)[:, None]
    img[..., 2] = 90
    return img


def detections(h=128, w=128, boxes=((60, 60, 110, 110),), scores=(0.9,), classes=(2,), with_masks=True):
    inst = Instances(
        (h, w),
        pred_boxes=Boxes(torch.tensor(boxes, dtype=torch.float32)),
        scores=torch.tensor(scores),
        pred_classes=torch.tensor(classes),
    )
    if with_masks:
        masks = torch.zeros(len(boxes), h, w, dtype=torch.bool)
        for i, (x1, y1, x2, y2) in enumerate(boxes):
            masks[i, y1:y2, x1:x2] = True
        inst.pred_masks = masks
    return inst


def test_output_is_a_new_image_of_the_same_shape_and_dtype():
    img = gradient_image()
    before = img.copy()
    out = draw_instances(img, detections(), ["a", "b", "c"])
    assert out.shape == img.shape and out.dtype == np.uint8
    assert np.array_equal(img, before)  # the input is not drawn on
    assert not np.array_equal(out, img)


def test_without_instances_the_image_is_unchanged():
    img = gradient_image()
    assert np.array_equal(draw_instances(img, Instances((128, 128)), ["a"]), img)
    assert np.array_equal(draw_instances(img, detections()[:0], ["a"]), img)
    # Everything below the score threshold: nothing drawn either.
    assert np.array_equal(draw_instances(img, detections(scores=(0.3,)), ["a", "b", "c"], score_threshold=0.5), img)


def test_mask_pixels_are_blended_with_the_class_colour_and_the_rest_is_untouched():
    img = gradient_image()
    alpha = 0.4
    out = draw_instances(img, detections(), ["a", "b", "c"], mask_alpha=alpha)
    color = np.array(class_color(2), dtype=np.float64)
    # Deep inside the mask (away from the outline and the label): exactly the blend.
    inner = (slice(75, 100), slice(70, 100))
    expected = np.round(img[inner].astype(np.float64) * (1 - alpha) + color * alpha)
    assert np.abs(out[inner].astype(np.int64) - expected).max() <= 1
    # Far from the box and its label (which sits above the box): untouched.
    assert np.array_equal(out[:30, :30], img[:30, :30])
    assert np.array_equal(out[115:, :50], img[115:, :50])


def test_box_outline_has_the_class_colour():
    img = np.zeros((128, 128, 3), np.uint8)
    out = draw_instances(img, detections(with_masks=False), None)
    color = np.array(class_color(2))
    # Middle of the left and bottom edges (x1 = 60, last row y2 - 1 = 109).
    assert np.abs(out[85, 60].astype(int) - color).max() <= 2
    assert np.abs(out[109, 85].astype(int) - color).max() <= 2
    assert np.array_equal(out[85, 85], [0, 0, 0])  # no mask: the inside stays as it was


def test_line_width_grows_with_the_image():
    def left_edge_width(size):
        box = (size // 4, size // 4, size // 2, size // 2)
        out = draw_instances(np.zeros((size, size, 3), np.uint8), detections(size, size, (box,), with_masks=False))
        row = out[size * 3 // 8, : size * 3 // 8].any(axis=1)
        return int(row.sum())

    assert left_edge_width(128) <= 2
    assert left_edge_width(1200) >= 3


def test_colours_are_deterministic_and_distinct():
    assert class_color(7) == class_color(7)
    colors = np.array([class_color(i) for i in range(12)], dtype=np.int64)
    assert all(0 <= c <= 255 for c in colors.flatten())
    dists = np.abs(colors[:, None] - colors[None]).sum(-1)
    assert dists[~np.eye(12, dtype=bool)].min() > 40


def test_label_text_uses_class_names():
    img = np.zeros((256, 256, 3), np.uint8)
    inst = detections(256, 256, ((100, 100, 150, 150),), with_masks=False)
    short = draw_instances(img, inst, ["a", "b", "c"])
    long = draw_instances(img, inst, ["a", "b", "a much longer class name"])
    # The label sits above the box; a longer name fills a wider strip there.
    assert long[:100].any(axis=(0, 2)).sum() > short[:100].any(axis=(0, 2)).sum()


def test_ground_truth_fields_are_drawn_without_a_score_threshold():
    img = gradient_image()
    poly = [[20.0, 20.0, 60.0, 20.0, 40.0, 60.0]]
    inst = Instances(
        (128, 128),
        gt_boxes=Boxes(torch.tensor([[20.0, 20.0, 60.0, 60.0]])),
        gt_classes=torch.tensor([0]),
        gt_masks=PolygonMasks([poly]),
    )
    out = draw_instances(img, inst, ["tri"], score_threshold=0.99)
    mask = BitMasks.from_polygons(PolygonMasks([poly]), 128, 128).tensor[0].numpy()
    assert (out[mask] != img[mask]).any(axis=1).mean() > 0.9
    # BitMasks work as well.
    inst.remove("gt_masks")
    inst.gt_masks = BitMasks(torch.from_numpy(mask[None]))
    assert not np.array_equal(draw_instances(img, inst, ["tri"]), img)


def test_masks_only_instances_are_drawn():
    img = gradient_image()
    inst = detections()
    inst.remove("pred_boxes")
    out = draw_instances(img, inst, ["a", "b", "c"])
    assert not np.array_equal(out[60:110, 60:110], img[60:110, 60:110])


def test_bad_inputs_raise():
    inst = detections()
    with pytest.raises(ValueError, match="uint8"):
        draw_instances(np.zeros((128, 128, 3), np.float32), inst)
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        draw_instances(np.zeros((128, 128), np.uint8), inst)
    with pytest.raises(ValueError, match="masks"):
        draw_instances(np.zeros((64, 64, 3), np.uint8), inst)
    with pytest.raises(TypeError, match="Instances"):
        draw_instances(np.zeros((128, 128, 3), np.uint8), {"pred_boxes": None})
    with pytest.raises(ValueError, match="nothing to draw"):
        draw_instances(np.zeros((128, 128, 3), np.uint8), Instances((128, 128), scores=torch.tensor([0.9])))


# --- keypoints ------------------------------------------------------------------------------------
KP_NAMES = ["head", "left_hand", "right_hand"]
KP_SKELETON = [("left_hand", "right_hand")]


def keypoint_detection(points, score=0.9):
    """One detection (class 2, box around the image) with keypoints [(x, y, logit), ...]."""
    inst = detections(boxes=((2, 2, 126, 126),), scores=(score,), with_masks=False)
    inst.pred_keypoints = torch.tensor([points], dtype=torch.float32)
    return inst


def color_at(img, x, y):
    return tuple(int(v) for v in img[y, x])


def test_keypoints_are_dots_coloured_by_side_on_the_skeleton():
    img = np.full((128, 128, 3), 128, np.uint8)
    # Points at the centers of pixels (30, 40), (90, 40), (60, 90).
    inst = keypoint_detection([(60.5, 90.5, 5.0), (90.5, 40.5, 5.0), (30.5, 40.5, 5.0)])
    out = draw_instances(img, inst, keypoint_names=KP_NAMES, keypoint_skeleton=KP_SKELETON)
    assert color_at(out, 90, 40) == (0, 140, 255)  # left hand: orange (on the image's right)
    assert color_at(out, 30, 40) == (255, 120, 0)  # right hand: blue
    assert color_at(out, 60, 90) == (255, 255, 255)  # head: white
    # The skeleton line (anti-aliased), in the class colour.
    line = np.array(color_at(out, 60, 40), dtype=float)
    assert np.abs(line - class_color(2)).max() < 0.3 * np.abs(np.array(class_color(2)) - 128).max()
    assert color_at(out, 45, 65) == (128, 128, 128)  # head is not joined to the hands


def test_keypoint_threshold_and_unlabeled_ground_truth_points_are_left_out():
    img = np.full((128, 128, 3), 128, np.uint8)
    inst = keypoint_detection([(60.5, 90.5, 5.0), (90.5, 40.5, 0.5), (30.5, 40.5, 5.0)])
    out = draw_instances(img, inst, keypoint_names=KP_NAMES, keypoint_skeleton=KP_SKELETON, keypoint_threshold=1.0)
    assert color_at(out, 90, 40) == (128, 128, 128) and color_at(out, 60, 40) == (128, 128, 128)
    assert color_at(out, 30, 40) == (255, 120, 0)

    from detcore.structures import Keypoints

    gt = Instances((128, 128), gt_boxes=Boxes(torch.tensor([[2.0, 2, 126, 126]])), gt_classes=torch.tensor([0]))
    gt.gt_keypoints = Keypoints(torch.tensor([[[60.5, 90.5, 2], [90.5, 40.5, 0], [30.5, 40.5, 1]]]))
    out = draw_instances(img, gt, keypoint_names=KP_NAMES)
    assert color_at(out, 90, 40) == (128, 128, 128) and color_at(out, 30, 40) == (255, 120, 0)


def test_keypoint_drawing_errors_name_the_problem():
    inst = keypoint_detection([(60.5, 90.5, 5.0), (90.5, 40.5, 5.0), (30.5, 40.5, 5.0)])
    img = gradient_image()
    with pytest.raises(ValueError, match=r"keypoint_skeleton names \['left_foot'\]"):
        draw_instances(img, inst, keypoint_names=KP_NAMES, keypoint_skeleton=[("left_hand", "left_foot")])
    with pytest.raises(ValueError, match="2 keypoint_names for 3 keypoints"):
        draw_instances(img, inst, keypoint_names=KP_NAMES[:2])
