import numpy as np
import pytest
import torch

from detcore.structures import BitMasks, Boxes, Instances, PolygonMasks
from detcore.utils.visualizer import class_color, draw_instances, upscale_factor


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
    for scale in (0, 2.5, True):
        with pytest.raises(ValueError, match="scale must be a whole number >= 1"):
            draw_instances(np.zeros((128, 128, 3), np.uint8), inst, scale=scale)


# --- small images drawn enlarged ------------------------------------------------------------------
def test_upscale_factor_reaches_the_short_side_with_a_whole_factor():
    assert upscale_factor(96, 128) == 5  # 480 x 640
    assert upscale_factor(160, 120) == 4  # 120 -> 480
    assert upscale_factor(100, 150) == 5  # ceil(480 / 100): 500, never short of it
    assert upscale_factor(480, 640) == 1 and upscale_factor(800, 1333) == 1
    assert upscale_factor(96, 128, min_short_side=0) == 1
    assert upscale_factor(20, 1000) == 2  # 24 would be needed; the long side caps it at 2400 // 1000
    assert upscale_factor(20, 3000) == 1
    with pytest.raises(ValueError, match="min_short_side"):
        upscale_factor(96, 128, min_short_side=-1)


def test_an_enlarged_picture_has_the_scaled_size_and_the_boxes_at_the_scaled_positions():
    img = gradient_image(96, 128)
    box = (20, 30, 70, 80)
    out = draw_instances(img, detections(96, 128, (box,), with_masks=False), ["a", "b", "c"], scale=5)
    assert out.shape == (480, 640, 3)
    # Away from the drawing, each source pixel is a 5 x 5 block of its own value.
    np.testing.assert_array_equal(out[400:480, 400:640], img[80:96, 80:128].repeat(5, 0).repeat(5, 1))
    color = np.array(class_color(2))
    x1, y1, x2, y2 = (5 * v for v in box)  # 100, 150, 350, 400: the last covered pixel is 349 / 399
    middle_y, middle_x = (y1 + y2) // 2, (x1 + x2) // 2
    for y, x in ((middle_y, x1), (middle_y, x2 - 1), (y2 - 1, middle_x)):
        assert np.abs(out[y, x].astype(int) - color).max() <= 2, (y, x)
    # Just outside the scaled box (and where the unscaled box would be drawn): the enlarged image.
    for y, x in ((middle_y, x1 - 1), (middle_y, x2), (y2, middle_x), (middle_y // 5, box[0])):
        np.testing.assert_array_equal(out[y, x], img[y // 5, x // 5])


def test_an_enlarged_mask_covers_the_scaled_pixels():
    img = gradient_image(96, 128)
    inst = detections(96, 128, ((40, 40, 60, 60),))
    alpha = 0.5
    out = draw_instances(img, inst, ["a", "b", "c"], mask_alpha=alpha, scale=4)
    color = np.array(class_color(2), dtype=np.float64)
    inner = (slice(4 * 42, 4 * 58), slice(4 * 42, 4 * 58))  # away from the outline
    source = img.repeat(4, 0).repeat(4, 1)[inner].astype(np.float64)
    assert np.abs(out[inner] - np.round(source * (1 - alpha) + color * alpha)).max() <= 1
    # Just right of and below the mask's last source pixel (59 -> 236..239): untouched.
    np.testing.assert_array_equal(out[4 * 50, 4 * 60 + 2], img[50, 60])
    np.testing.assert_array_equal(out[4 * 60 + 2, 4 * 50], img[60, 50])


def test_labels_of_an_enlarged_picture_leave_the_object_visible():
    # At its own size a label ~10 px tall sits on a 96 px image; enlarged, the same label is a
    # small part of the box it names. The box interior stays mostly the object's own pixels.
    img = np.full((96, 128, 3), 40, np.uint8)
    img[30:60, 30:60] = 200
    inst = detections(96, 128, ((30, 30, 60, 60),), with_masks=False)

    def covered(out, scale):
        inside = out[30 * scale : 60 * scale, 30 * scale : 60 * scale]
        return float((inside != 200).any(axis=2).mean())

    small = draw_instances(img, inst, ["a square"], scale=1)
    big = draw_instances(img, inst, ["a square"], scale=upscale_factor(96, 128))
    assert covered(big, 5) < 0.1 < covered(small, 1)




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


def test_keypoints_of_an_enlarged_picture_sit_at_the_scaled_positions():
    img = np.full((128, 128, 3), 128, np.uint8)
    inst = keypoint_detection([(60.5, 90.5, 5.0), (90.5, 40.5, 5.0), (30.5, 40.5, 5.0)])
    out = draw_instances(img, inst, keypoint_names=KP_NAMES, keypoint_skeleton=KP_SKELETON, scale=4)
    # The continuous point (90.5, 40.5) is (362, 162) enlarged: the centre of pixel (361.5, 161.5).
    assert color_at(out, 362, 162) == (0, 140, 255) and color_at(out, 122, 162) == (255, 120, 0)
    assert color_at(out, 90, 40) == (128, 128, 128)  # nothing at the unscaled position
