"""The model's NUM_CLASSES against the datasets' classes: the key each architecture reads, the
background convention (not counted), and errors naming the key, both numbers and the dataset."""
import json
import os
import uuid

import pytest

from detcore.config import get_cfg
from detcore.data import DatasetCatalog, MetadataCatalog
from detcore.engine import DefaultTrainer
from detcore.engine.dataset_classes import check_dataset_classes, num_classes_key

from tests.engine.toy_model import REPO, R18_CONFIG, TOY, make_cfg


@pytest.fixture
def dataset():
    """``dataset(classes)``: a registered name whose metadata has ``classes`` (None: none), removed after."""
    names = []

    def add(classes):
        name = f"classes_{uuid.uuid4().hex[:8]}"
        DatasetCatalog.register(name, lambda: [])
        if classes is not None:
            MetadataCatalog.get(name).thing_classes = list(classes)
        names.append(name)
        return name

    yield add
    for name in names:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def config(path):
    cfg = get_cfg()
    cfg.merge_from_file(os.path.join(REPO, "configs", path))
    return cfg


def test_the_key_follows_the_architecture():
    assert num_classes_key(config("e2e_mask_rcnn_R_18_FPN_shapes.yaml")) == "MODEL.ROI_HEADS.NUM_CLASSES"
    assert num_classes_key(config("retinanet_R_18_FPN_shapes.yaml")) == "MODEL.RETINANET.NUM_CLASSES"
    assert num_classes_key(config("rpn_R_18_FPN_shapes.yaml")) is None


def test_matching_counts_pass_and_background_is_not_counted(dataset):
    three = dataset(["circle", "square", "triangle"])
    check_dataset_classes(config("e2e_mask_rcnn_R_18_FPN_shapes.yaml"), [three, three])  # NUM_CLASSES 3
    check_dataset_classes(config("retinanet_R_18_FPN_shapes.yaml"), [three])
    check_dataset_classes(config("rpn_R_18_FPN_shapes.yaml"), [dataset(["a"])])  # no classes to check
    check_dataset_classes(config("e2e_mask_rcnn_R_18_FPN_shapes.yaml"), [dataset(None)])  # none declared


def test_a_count_mismatch_names_key_numbers_and_dataset(dataset):
    four = dataset(["a", "b", "c", "d"])
    with pytest.raises(ValueError) as e:
        check_dataset_classes(config("e2e_mask_rcnn_R_18_FPN_shapes.yaml"), [four])
    assert str(e.value).startswith(f"MODEL.ROI_HEADS.NUM_CLASSES is 3, but dataset '{four}' has 4 classes ['a', 'b'")
    assert "set MODEL.ROI_HEADS.NUM_CLASSES 4 (the background class is not counted)" in str(e.value)
    with pytest.raises(ValueError, match=f"MODEL.RETINANET.NUM_CLASSES is 3, but dataset '{four}' has 4 classes"):
        check_dataset_classes(config("retinanet_R_18_FPN_shapes.yaml"), [four])


def test_datasets_with_other_classes_are_refused_together(dataset):
    a, b = dataset(["cat", "dog", "bird"]), dataset(["dog", "cat", "bird"])
    with pytest.raises(ValueError, match=f"Datasets '{a}' and '{b}' have different classes"):
        check_dataset_classes(config("e2e_mask_rcnn_R_18_FPN_shapes.yaml"), [a, b])


def test_the_trainer_and_test_check_before_building(tmp_path):
    """A user's json with 2 categories and the config's 3: DefaultTrainer refuses before building
    the model or reading images, and so does DefaultTrainer.test (test_net, --eval-only)."""
    folder = tmp_path / "my data"
    folder.mkdir()
    json_file = folder / "train.json"
    json_file.write_text(json.dumps({"images": [], "annotations": [], "categories": [
        {"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}))
    name = f"coco:{json_file}"
    try:
        cfg = make_cfg(tmp_path / "out", TOY + ["DATASETS.TRAIN", f"('{name}',)", "DATASETS.TEST", "()"], R18_CONFIG)
        message = f"MODEL.ROI_HEADS.NUM_CLASSES is 3, but dataset '{name}' has 2 classes ['cat', 'dog']"
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            DefaultTrainer(cfg)
        cfg = make_cfg(tmp_path / "out", TOY + ["DATASETS.TEST", f"('{name}',)"], R18_CONFIG)
        with pytest.raises(ValueError, match="NUM_CLASSES is 3, but dataset"):
            DefaultTrainer.test(cfg, model=None)
    finally:
        if name in DatasetCatalog:
            DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
