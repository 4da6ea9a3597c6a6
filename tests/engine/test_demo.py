"""Input path collection, the drawing loop (with a stand-in predictor) and the config and class
names of tools/demo.py, from a config file or a model zoo name."""
import os

import cv2
import numpy as np
import pytest
import torch
from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights

from detcore.data import MetadataCatalog
from detcore.engine.demo import collect_image_paths, demo_config, demo_metadata, visualize_images
from detcore.structures import Boxes, Instances

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_image(path, value=90, size=(40, 60)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cv2.imwrite(str(path), np.full((*size, 3), value, np.uint8))
    return str(path)


def test_collect_folders_files_and_globs(tmp_path):
    a = write_image(tmp_path / "imgs" / "b.png")
    b = write_image(tmp_path / "imgs" / "a.jpg")
    (tmp_path / "imgs" / "notes.txt").write_text("not an image")
    c = write_image(tmp_path / "other" / "c.png")
    d = write_image(tmp_path / "other" / "d.png")
    got = collect_image_paths([str(tmp_path / "imgs"), c, str(tmp_path / "other" / "*.png")])
    assert got == [b, a, c, d]  # folder sorted, then the file, then the glob minus the repeat
    with pytest.raises(FileNotFoundError, match="matches no image"):
        collect_image_paths([str(tmp_path / "missing" / "*.png")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no image"):
        collect_image_paths([str(tmp_path / "empty")])


def test_visualize_writes_one_png_per_image_with_the_detections(tmp_path):
    p1 = write_image(tmp_path / "x" / "same.png")
    p2 = write_image(tmp_path / "y" / "same.png")
    calls = []

    def predictor(image):
        calls.append(image.shape)
        h, w = image.shape[:2]
        return {"instances": Instances(
            (h, w),
            pred_boxes=Boxes(torch.tensor([[5.0, 5.0, 30.0, 25.0], [0.0, 0.0, 4.0, 4.0]])),
            scores=torch.tensor([0.9, 0.1]),
            pred_classes=torch.tensor([1, 0]),
        )}

    written = visualize_images(
        predictor, [p1, p2], str(tmp_path / "out"), class_names=["a", "b"], score_threshold=0.5, min_size=0
    )
    assert [os.path.basename(p) for p in written] == ["same.png", "same_1.png"]
    assert calls == [(40, 60, 3), (40, 60, 3)]
    out = cv2.imread(written[0])
    assert out.shape == (40, 60, 3)
    assert (out[5, 5:30] != 90).any()  # the kept box's top edge is drawn
    assert (out[0:4, 0:4] == 90).all()  # the 0.1-score box is not


def test_small_images_are_drawn_enlarged_with_the_boxes_scaled(tmp_path):
    path = write_image(tmp_path / "small.png", size=(40, 60))  # 12x: short side 480

    def predictor(image):
        h, w = image.shape[:2]
        return {"instances": Instances(
            (h, w), pred_boxes=Boxes(torch.tensor([[5.0, 10.0, 30.0, 25.0]])), scores=torch.tensor([0.9]),
            pred_classes=torch.tensor([1]),
        )}

    (written,) = visualize_images(predictor, [path], str(tmp_path / "out"), class_names=["a", "b"])
    out = cv2.imread(written)
    assert out.shape == (480, 720, 3)
    # The box's bottom edge at y = 12 * 25 - 1, from x = 60 to 359; nothing just below it.
    assert (out[299, 70:350] != 90).any(axis=1).all()
    assert (out[301:320, 70:350] == 90).all()
    big = write_image(tmp_path / "big.png", size=(500, 600))
    (written,) = visualize_images(predictor, [big], str(tmp_path / "out2"))
    assert cv2.imread(written).shape == (500, 600, 3)  # already large enough: its own size


def test_visualize_draws_keypoints_on_their_skeleton(tmp_path):
    path = write_image(tmp_path / "a.png", size=(60, 80))

    def predictor(image):
        inst = Instances((60, 80), pred_boxes=Boxes(torch.tensor([[2.0, 2.0, 78.0, 58.0]])), scores=torch.tensor([0.9]))
        inst.pred_classes = torch.tensor([0])
        inst.pred_keypoints = torch.tensor([[[20.5, 30.5, 3.0], [60.5, 30.5, 3.0]]])
        return {"instances": inst}

    (written,) = visualize_images(
        predictor, [path], str(tmp_path / "out"), keypoint_names=["left_hand", "right_hand"],
        keypoint_skeleton=[("left_hand", "right_hand")], min_size=0,  # at its own size: pixels as placed
    )
    out = cv2.imread(written)
    assert tuple(out[30, 20]) == (0, 140, 255) and tuple(out[30, 60]) == (255, 120, 0)  # left / right colours
    assert (out[30, 40] != 90).any()  # the skeleton line between them


def test_unreadable_image_is_an_error(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(OSError, match="could not read"):
        visualize_images(lambda im: None, [str(bad)], str(tmp_path / "out"))


def test_demo_config_from_a_model_name_a_config_file_or_both(tmp_path):
    cfg = demo_config(model="torchvision/mask_rcnn_R_50_FPN", opts=["MODEL.DEVICE", "cpu"])
    assert cfg.MODEL.WEIGHTS == "torchvision/mask_rcnn_R_50_FPN" and cfg.MODEL.MASK_ON
    assert cfg.MODEL.ROI_HEADS.NUM_CLASSES == 90 and cfg.MODEL.DEVICE == "cpu"
    preset = os.path.join(REPO, "configs", "detectron2", "retinanet_R_50_FPN_1x.yaml")
    cfg = demo_config(config_file=preset, model="torchvision/mask_rcnn_R_50_FPN")
    assert cfg.MODEL.META_ARCHITECTURE == "RetinaNet" and cfg.MODEL.WEIGHTS == "torchvision/mask_rcnn_R_50_FPN"
    cfg = demo_config(config_file=preset, opts=["MODEL.WEIGHTS", "mine.pth"])
    assert cfg.MODEL.WEIGHTS == "mine.pth"
    with pytest.raises(ValueError, match="give a config file"):
        demo_config()
    with pytest.raises(ValueError, match="URL outside detcore's catalog: it has no preset, give --config-file"):
        demo_config(model="https://example.org/model.pth")
    url = "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/retinanet_R_50_FPN_1x/190397773/model_final_bfca0b.pkl"
    cfg = demo_config(model=url)  # a catalog URL: its entry's preset
    assert cfg.MODEL.META_ARCHITECTURE == "RetinaNet" and cfg.MODEL.WEIGHTS == "detectron2/COCO-Detection/retinanet_R_50_FPN_1x"


def test_demo_names_classes_by_what_the_weights_predict():
    # torchvision's model: 90 classes by COCO category id, "N/A" where COCO has no category.
    meta = demo_metadata(demo_config(model="torchvision/mask_rcnn_R_50_FPN"))
    assert meta["class_names"] == MaskRCNN_ResNet50_FPN_Weights.COCO_V1.meta["categories"][1:]
    meta = demo_metadata(demo_config(model="detectron2/COCO-Keypoints/keypoint_rcnn_R_50_FPN_3x"))
    assert meta["class_names"] == ["person"] and len(meta["keypoint_names"]) == 17 and meta["keypoint_skeleton"]
    # Weights whose classes are not the model's: the test dataset's names, not the catalog's.
    cfg = demo_config(model="torchvision/mask_rcnn_R_50_FPN", opts=["MODEL.ROI_HEADS.NUM_CLASSES", "6",
                                                                    "DATASETS.TEST", "('shapes_val',)"])
    assert demo_metadata(cfg)["class_names"] == MetadataCatalog.get("shapes_val").thing_classes
