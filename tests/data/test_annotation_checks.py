"""Unusable annotations and broken images: dropped with a logged count (annotations) or a clear
error naming the file (images), in training and in evaluation alike
(detcore.data.datasets.annotation_checks; the VOC and Cityscapes loaders have their own tests)."""
import json
import logging
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest

from detcore.data import load_coco_json
from detcore.data.datasets.annotation_checks import coco_annotation_reason, image_size_problem
from detcore.data.detection_utils import read_image

from .files import write_png

REPO = Path(__file__).resolve().parents[2]
W, H = 60, 40
SQUARE = [[10, 10, 30, 10, 30, 30, 10, 30]]


def ann(ann_id, bbox=(10, 10, 20, 20), segmentation=SQUARE):
    return {"id": ann_id, "image_id": 1, "category_id": 1, "bbox": list(bbox), "iscrowd": 0, "segmentation": segmentation}


# (annotation, the reason it is dropped); bbox is COCO's [x, y, w, h].
UNUSABLE = [
    (ann(2, bbox=(float("nan"), 10, 20, 20)), "non-finite bbox"),
    (ann(3, bbox=(10, 10, float("inf"), 20)), "non-finite bbox"),
    (ann(4, bbox=(30, 10, -10, 20)), "bbox with zero or negative width or height"),
    (ann(5, bbox=(10, 10, 20, 0)), "bbox with zero or negative width or height"),
    (ann(6, bbox=(70, 10, 20, 20)), "bbox outside the image"),
    (ann(7, bbox=(10, 10, 1e9, 20)), "bbox far outside the image"),
    (ann(8, segmentation=[[10, 10, float("nan"), 10, 30, 30]]), "non-finite polygon coordinate"),
    (ann(9, segmentation=[[10, 10, 1e9, 10, 30, 1e9]]), "polygon far outside the image"),
    (ann(10, segmentation=[[10, 10, 30, 10]]), "no polygon with 3 or more points"),
    # json integers have any number of digits: beyond the float range they are infinite as floats.
    (ann(11, segmentation=[[10, 10, 10**400, 10, 30, 30]]), "non-finite polygon coordinate"),
    (ann(12, bbox=(10, 10, -(10**400), 20)), "non-finite bbox"),
]


@pytest.mark.parametrize("annotation, reason", UNUSABLE, ids=[r for _, r in UNUSABLE])
def test_coco_annotation_reason(annotation, reason):
    assert coco_annotation_reason(annotation, W, H) == reason


def test_usable_annotations_pass():
    assert coco_annotation_reason(ann(1), W, H) is None
    assert coco_annotation_reason(ann(1, bbox=(-5, -5, 20, 20)), W, H) is None  # partly outside: clipped later
    assert coco_annotation_reason(ann(1, segmentation={"counts": "abc", "size": [H, W]}), W, H) is None  # RLE


def write_dataset(tmp_path, annotations, width=W, height=H):
    write_png(tmp_path / "a.png", H, W)
    data = {
        "images": [{"id": 1, "file_name": "a.png", "height": height, "width": width}],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
    }
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))  # Python's json writes NaN / Infinity tokens, as a careless tool would
    return path


def test_the_loader_drops_unusable_annotations_and_says_which(tmp_path, caplog):
    path = write_dataset(tmp_path, [ann(1)] + [a for a, _ in UNUSABLE])
    with caplog.at_level(logging.WARNING):
        records = load_coco_json(path, tmp_path)
    assert [a["id"] for a in records[0]["annotations"]] == [1]
    assert "dropped 11 unusable annotation(s)" in caplog.text
    assert "3 with non-finite bbox (annotation ids 2, 3, 12)" in caplog.text
    assert "2 with non-finite polygon coordinate (annotation ids 8, 11)" in caplog.text
    assert "1 with polygon far outside the image (annotation ids 9)" in caplog.text
    assert str(path) in caplog.text


# Training and evaluating on an absurd polygon once grew to 23 GB (or segfaulted in pycocotools
# under a memory cap). Here both run in a child process capped at 3 GiB of address space.
_CHILD = textwrap.dedent(
    """
    import resource, sys
    import numpy as np, torch
    from detcore.data import DatasetMapper, load_coco_json
    from detcore.data.transforms import ResizeShortestEdge
    from detcore.evaluation import COCOEvaluator
    from detcore.structures import Boxes, Instances
    # At most 2 GiB more address space than the imports took (torch maps a lot up front).
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
    json_file, root = sys.argv[1], sys.argv[2]
    records = load_coco_json(json_file, root)
    mapper = DatasetMapper(True, [ResizeShortestEdge((40,), 1000)], use_instance_mask=True)
    out = mapper(records[0])
    masks = out["instances"].gt_masks
    print("train instances", len(out["instances"]))
    ev = COCOEvaluator(json_file, ("bbox", "segm"))
    ev.reset()
    inst = Instances((40, 60), pred_boxes=Boxes(torch.tensor([[10.0, 10.0, 30.0, 30.0]])), scores=torch.tensor([0.9]),
                     pred_classes=torch.tensor([0]), pred_masks=torch.zeros(1, 40, 60, dtype=torch.bool))
    inst.pred_masks[0, 10:30, 10:30] = True
    ev.process([{"image_id": 1}], [{"instances": inst}])
    print("bbox AP", round(ev.evaluate()["bbox"]["AP"], 1))
    """
)


def test_absurd_and_non_finite_polygons_neither_exhaust_memory_nor_crash(tmp_path):
    path = write_dataset(tmp_path, [ann(1)] + [a for a, _ in UNUSABLE[6:]])  # NaN, 1e9 and 400-digit polygons, ...
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train instances 1" in result.stdout and "bbox AP 100.0" in result.stdout


@pytest.mark.parametrize(
    "width, height, match",
    [
        (float("nan"), H, r"image #0 \(id 1\) needs 'width' of type int, got nan"),
        (W, 10**400, r"image id 1: the image height must lie in 1..1048576 pixels, got 1000"),
        (W, 0, r"image id 1: the image height must lie in 1..1048576 pixels, got 0"),
        (1 << 20, 1 << 11, "image id 1: the image size 1048576 x 2048 exceeds 1073741824 pixels"),
    ],
)
def test_an_impossible_image_size_is_an_error_naming_the_file_and_image(tmp_path, width, height, match):
    path = write_dataset(tmp_path, [ann(1)], width=width, height=height)
    with pytest.raises(ValueError, match=match) as info:
        load_coco_json(path, tmp_path)
    assert str(info.value).startswith(f"{path}: image ")


def test_image_sizes():
    assert image_size_problem(W, H) is None and image_size_problem(float(W), H) is None
    assert image_size_problem(1 << 20, 1 << 10) is None  # the largest OpenCV reads
    assert "whole number" in image_size_problem(True, H) and "whole number" in image_size_problem(W, 2.5)


def test_a_truncated_jpeg_is_an_error_naming_the_file(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".jpg", image)
    whole = tmp_path / "whole.jpg"
    whole.write_bytes(encoded.tobytes())
    assert read_image(str(whole)).shape == (64, 64, 3)
    trailing = tmp_path / "trailing.jpg"  # bytes after the end marker (some cameras): still fine
    trailing.write_bytes(encoded.tobytes() + b"EXTRA-BYTES")
    assert read_image(str(trailing)).shape == (64, 64, 3)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(encoded.tobytes()[: len(encoded) * 2 // 3])
    with pytest.raises(OSError, match=r"cut\.jpg is a truncated JPEG"):
        read_image(str(cut))


def test_resource_limit_is_available():
    # The memory-capped child above relies on RLIMIT_AS (Linux).
    assert resource.getrlimit(resource.RLIMIT_AS) is not None
