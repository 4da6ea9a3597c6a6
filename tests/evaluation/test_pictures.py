"""The evaluation pictures: each figure's content checked against the numbers it draws (and those
against pycocotools), the gallery's frames against the errors, and COCOEvaluator writing the
pictures next to its metrics from a small synthetic dataset on disk."""
import json
import logging
import os

import cv2
import numpy as np
import pytest
import torch
from pycocotools.coco import COCO

from detcore.evaluation import METRICS_FILE, COCOEvaluator
from detcore.evaluation.error_analysis import confusion_matrix, match_coco, precision_recall
from detcore.evaluation.error_gallery import GALLERY_FILE, draw_error_gallery, worst_images
from detcore.evaluation.pictures import plot_confusion_matrix, plot_per_category_ap, plot_pr_curves
from detcore.structures import Boxes, Instances

from .synthetic_coco import SIZE, make_synthetic
from .test_error_analysis import confusion_case, evaluate, quiet


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    data = make_synthetic(str(tmp_path_factory.mktemp("synthetic")), num_images=6, seed=0)
    gt = quiet(COCO, data.json_file)
    return data, gt, evaluate(gt, data.results)


def png_shape(path):
    image = cv2.imread(str(path))
    assert image is not None, path
    return image.shape


def test_pr_curves_draw_cocoevals_curves_whose_area_is_pycocotools_ap(synthetic, tmp_path):
    data, gt, ev = synthetic
    pr = precision_recall(ev, data.cat_ids)
    fig = plot_pr_curves(pr, str(tmp_path / "pr.png"), "bbox")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == [f"{n}: AP {a:.1f}" for n, a in zip(pr.names, pr.ap)]
    for k, (ax, cat) in enumerate(zip(panels, data.cat_ids)):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(pr.curves)
        for j, (thr, label) in enumerate(((0.5, "IoU 0.5"), (0.75, "IoU 0.75"))):
            x, y = lines[label].get_xdata(), lines[label].get_ydata()
            np.testing.assert_array_equal(x, pr.recall)
            np.testing.assert_array_equal(y, pr.precision[j, k])
            # The drawn curve's area (its mean over the 101 recall points) is pycocotools' AP
            # of this class alone at this IoU.
            assert np.mean(y) == pytest.approx(evaluate(gt, data.results, cat_ids=[cat], iou_thrs=[thr]).stats[0])
        assert 100 * np.mean(lines["IoU 0.5:0.95"].get_ydata()) == pytest.approx(pr.ap[k])
    h, w, _ = png_shape(tmp_path / "pr.png")
    assert w >= 900 and h >= 350  # three readable panels


def test_per_category_ap_bars_are_the_ap_best_first(synthetic, tmp_path):
    data, gt, ev = synthetic
    pr = precision_recall(ev, data.cat_ids)
    ap = np.append(pr.ap, np.nan)  # a class without ground truth is named, not drawn as 0
    fig = plot_per_category_ap(ap, pr.names + ["hexagon"], str(tmp_path / "ap.png"))
    ax = fig.axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    order = np.argsort(-pr.ap)
    assert labels == [pr.names[i] for i in order]
    np.testing.assert_allclose(widths, pr.ap[order])
    assert [t.get_text() for t in ax.texts] == [f"{v:.1f}" for v in pr.ap[order]]
    assert any("no ground truth: hexagon" in t.get_text() for t in fig.texts)
    with pytest.raises(ValueError, match="3 AP values for 2 names"):
        plot_per_category_ap(pr.ap, pr.names[:2], str(tmp_path / "bad.png"))


def test_confusion_matrix_picture_writes_the_counts(tmp_path):
    gt, dets = confusion_case()
    matrix = confusion_matrix(match_coco(gt, dets, [1, 2, 3], [10, 20, 30]), 3)
    fig = plot_confusion_matrix(matrix, ["a", "b", "c"], str(tmp_path / "cm.png"))
    ax = fig.axes[0]
    written = {(round(t.get_position()[1]), round(t.get_position()[0])): int(t.get_text()) for t in ax.texts}
    expected = {(i, j): int(c) for (i, j), c in np.ndenumerate(matrix) if not i == j == 3}
    assert written == expected  # every cell but background x background, counts as computed
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "background"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c", "background"]
    # Colour: each cell's share of its row.
    shares = ax.images[0].get_array()
    np.testing.assert_allclose(shares[0], matrix[0] / matrix[0].sum())
    h, w, _ = png_shape(tmp_path / "cm.png")
    assert min(h, w) >= 600
    with pytest.raises(ValueError, match=r"must be \[4, 4\] for 3 names"):
        plot_confusion_matrix(matrix[:3, :3], ["a", "b", "c"], str(tmp_path / "bad.png"))


def test_gallery_frames_every_error_of_the_worst_images(synthetic, tmp_path):
    data, gt, _ = synthetic
    matches = match_coco(gt, data.results, sorted(gt.imgs), data.cat_ids)
    worst = worst_images(matches, 3)
    errors = [m.num_errors for m in worst]
    assert errors == sorted(errors, reverse=True) and errors[-1] > 0
    assert all(m.num_errors <= errors[-1] for m in matches if m not in worst)
    fig = draw_error_gallery(str(tmp_path / GALLERY_FILE), gt, data.results, matches, data.cat_ids, data.files,
                             max_images=3)
    assert len(fig.patches) == sum(errors)  # one red frame per miss, false positive, wrong class
    titles = [t.get_text() for t in fig.texts if t.get_text().startswith("image ")]
    assert [int(t.split()[1]) for t in titles] == [m.image_id for m in worst]
    h, w, _ = png_shape(tmp_path / GALLERY_FILE)
    assert w >= 2 * 480  # panels of the demo's size: the 160-pixel images enlarged 3 times
    # An image that cannot be read is left out with a warning; none left: nothing drawn.
    assert draw_error_gallery(str(tmp_path / "none.png"), gt, data.results, matches, data.cat_ids,
                              {m.image_id: str(tmp_path / "missing.png") for m in matches}, max_images=2) is None
    assert not (tmp_path / "none.png").exists()


def predictions(data, with_masks):
    """The synthetic results as model outputs, per image (class k is data.cat_ids[k])."""
    out = {image_id: [] for image_id in data.files}
    for r in data.results:
        out[r["image_id"]].append(r)
    index = {c: k for k, c in enumerate(data.cat_ids)}
    for image_id, rs in out.items():
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (r["bbox"] for r in rs)]).reshape(-1, 4)
        inst = Instances((SIZE, SIZE), pred_boxes=Boxes(boxes), scores=torch.tensor([r["score"] for r in rs]),
                         pred_classes=torch.tensor([index[r["category_id"]] for r in rs], dtype=torch.int64))
        if with_masks:
            masks = torch.zeros(len(rs), SIZE, SIZE, dtype=torch.bool)
            for i, (x0, y0, x1, y1) in enumerate(boxes.round().int().tolist()):
                masks[i, y0:y1, x0:x1] = True
            inst.pred_masks = masks
        out[image_id] = {"instances": inst}
    return out


def run(evaluator, data, with_masks=False):
    evaluator.reset()
    for image_id, output in predictions(data, with_masks).items():
        evaluator.process([{"image_id": image_id, "file_name": data.files[image_id]}], [output])
    return evaluator.evaluate()


def test_coco_evaluator_writes_the_pictures_next_to_its_metrics(synthetic, tmp_path):
    data, gt, _ = synthetic
    out = tmp_path / "inference"
    ev = COCOEvaluator(data.json_file, ("bbox", "segm"), str(out))
    results = run(ev, data, with_masks=True)
    assert sorted(os.listdir(out)) == sorted([
        "coco_instances_results.json", METRICS_FILE, GALLERY_FILE,
        "bbox_pr_curves.png", "bbox_per_category_ap.png", "bbox_confusion_matrix.png",
        "segm_pr_curves.png", "segm_per_category_ap.png", "segm_confusion_matrix.png",
    ])
    # The pictures' numbers are the metrics' (the per-category AP file draws AP-<name>).
    with open(out / METRICS_FILE) as f:
        assert json.load(f)["bbox"]["AP-circle"] == pytest.approx(results["bbox"]["AP-circle"])
    assert results["bbox"]["AP-circle"] == pytest.approx(100 * evaluate(gt, data.results, cat_ids=[1]).stats[0])


def test_pictures_can_be_turned_off_and_a_drawing_failure_costs_no_numbers(synthetic, tmp_path, monkeypatch, caplog):
    data, _, _ = synthetic
    off = tmp_path / "off"
    assert "bbox" in run(COCOEvaluator(data.json_file, "bbox", str(off), pictures=False), data)
    assert not [n for n in os.listdir(off) if n.endswith(".png")]

    from detcore.evaluation import pictures

    def broken(*args, **kwargs):
        raise RuntimeError("no canvas")

    monkeypatch.setattr(pictures, "plot_pr_curves", broken)
    failing = tmp_path / "failing"
    with caplog.at_level(logging.ERROR, logger="detcore.evaluation.coco_evaluation"):
        results = run(COCOEvaluator(data.json_file, "bbox", str(failing)), data)
    assert results["bbox"]["AP"] > 0 and (failing / METRICS_FILE).is_file()
    assert "could not draw the evaluation pictures" in caplog.text and "no canvas" in caplog.text


def test_many_classes_keep_the_worst(tmp_path, monkeypatch):
    from detcore.evaluation import pictures

    monkeypatch.setattr(pictures, "MAX_CLASSES_DRAWN", 3)
    names = ["a", "b", "c", "d", "e"]
    ap = np.array([50.0, 10.0, np.nan, 30.0, 5.0])
    ax = plot_per_category_ap(ap, names, str(tmp_path / "ap.png")).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["d", "b", "e"]  # lowest AP, best first
    # Errors per class (row + column off the diagonal): a 2, b 6, c 0, d 3, e 3.
    matrix = np.zeros((6, 6), dtype=np.int64)
    matrix[0, 0], matrix[0, 5] = 9, 1
    matrix[1, 5], matrix[5, 1], matrix[1, 3], matrix[1, 0] = 2, 2, 1, 1
    matrix[3, 5], matrix[5, 3] = 1, 1
    matrix[4, 4], matrix[4, 5], matrix[5, 4] = 4, 1, 2
    ax = plot_confusion_matrix(matrix, names, str(tmp_path / "cm.png")).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b", "d", "e", "background"]
    shares = ax.images[0].get_array()
    np.testing.assert_allclose(shares[0], [0, 1 / 4, 0, 2 / 4])  # b's row: of its 4, one went to a (not shown)
    assert "3 of 5 classes" in ax.get_title()
