"""The model zoo catalog and the names it resolves: URLs and checksums as their publishers give
them (torchvision's against the installed torchvision's weight enums), presets that exist, class
names against torchvision's own metadata, and the spellings MODEL.WEIGHTS accepts."""
import os
from dataclasses import replace

import pytest
from torchvision.models import detection as tv_detection
from torchvision.models import resnet as tv_resnet

from detcore.checkpoint import FORMATS, model_zoo
from detcore.checkpoint.catalog import CATALOG, CLASS_SETS, Checksum, ZooEntry, register
from detcore.checkpoint.model_zoo import get_config, get_config_file, get_entry, lookup, metadata, url_checksum

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The installed torchvision's published files: the weight enums its builders download.
TORCHVISION_WEIGHTS = {
    "torchvision/mask_rcnn_R_50_FPN": tv_detection.MaskRCNN_ResNet50_FPN_Weights.COCO_V1,
    "torchvision/faster_rcnn_R_50_FPN": tv_detection.FasterRCNN_ResNet50_FPN_Weights.COCO_V1,
    "torchvision/keypoint_rcnn_R_50_FPN": tv_detection.KeypointRCNN_ResNet50_FPN_Weights.COCO_V1,
    "torchvision/retinanet_R_50_FPN": tv_detection.RetinaNet_ResNet50_FPN_Weights.COCO_V1,
    "torchvision/resnet18": tv_resnet.ResNet18_Weights.IMAGENET1K_V1,
    "torchvision/resnet34": tv_resnet.ResNet34_Weights.IMAGENET1K_V1,
    "torchvision/resnet50": tv_resnet.ResNet50_Weights.IMAGENET1K_V1,
    "torchvision/resnet101": tv_resnet.ResNet101_Weights.IMAGENET1K_V1,
    "torchvision/resnet152": tv_resnet.ResNet152_Weights.IMAGENET1K_V1,
    "torchvision/resnext101_32x8d": tv_resnet.ResNeXt101_32X8D_Weights.IMAGENET1K_V1,
}


def test_torchvision_entries_are_torchvisions_urls_with_their_hash_prefix():
    torchvision_names = {n for n in CATALOG if n.startswith("torchvision/")}
    assert torchvision_names == set(TORCHVISION_WEIGHTS)
    for name, weights in TORCHVISION_WEIGHTS.items():
        entry = CATALOG[name]
        assert entry.url == weights.url, name
        # torch.hub's rule: the digits after the last "-" of the file name start the sha256.
        digits = weights.url.rsplit("/", 1)[1].rsplit("-", 1)[1].split(".")[0]
        assert entry.checksum == Checksum("sha256", digits), name


def test_detectron2_entries_carry_the_md5_prefix_of_their_file_name():
    detectron2 = [e for e in CATALOG.values() if e.name.startswith("detectron2/COCO-")]
    assert len(detectron2) == 21  # MODEL_ZOO.md's FPN and C4 COCO models detcore runs
    for entry in detectron2:
        zoo_name = entry.name[len("detectron2/"):]
        assert entry.url.startswith(f"https://dl.fbaipublicfiles.com/detectron2/{zoo_name}/"), entry.name
        file = entry.url.rsplit("/", 1)[1]
        assert file.startswith("model_final_") and file.endswith(".pkl"), entry.name
        assert entry.checksum == Checksum("md5", file[len("model_final_"):-len(".pkl")]), entry.name
        assert entry.format == "detectron2"


def test_every_entry_is_complete():
    for entry in CATALOG.values():
        assert entry.format in FORMATS, entry.name
        assert entry.classes in CLASS_SETS + (None,), entry.name
        assert entry.checksum_source, entry.name
        if entry.config is not None:
            assert os.path.isfile(os.path.join(REPO, "configs", entry.config)), entry.name
        if entry.checksum is None:  # verified by layout: must be a format the layout check knows
            assert entry.format in ("caffe2-resnet", "torchvision-resnet"), entry.name
    # Names and aliases name one entry each.
    names = [n for e in CATALOG.values() for n in (e.name, *e.aliases)]
    assert len(names) == len(set(names))


def test_names_aliases_preset_paths_and_urls_find_the_entry():
    entry = CATALOG["detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x"]
    for spelling in (
        entry.name,
        "detectron2/mask_rcnn_R_50_FPN_3x",
        "configs/detectron2/mask_rcnn_R_50_FPN_3x.yaml",
        "detectron2/mask_rcnn_R_50_FPN_3x.yaml",
    ):
        assert get_entry(spelling) is entry, spelling
    assert lookup(entry.url) is entry
    assert lookup(entry.url + "#sha256=" + "0" * 64) is entry  # the catalog's checksum then applies
    assert lookup("detectron2://ImageNetPretrained/MSRA/R-50.pkl") is CATALOG["detectron2/ImageNetPretrained/MSRA/R-50"]
    assert get_entry("torchvision/maskrcnn_resnet50_fpn") is CATALOG["torchvision/mask_rcnn_R_50_FPN"]
    assert lookup("https://example.org/not-in-the-catalog.pth") is None
    with pytest.raises(KeyError, match="did you mean torchvision/mask_rcnn_R_50_FPN"):
        get_entry("torchvision/mask_rcnn_R50_FPN")


def test_a_file_always_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "mask_rcnn_R_50_FPN").write_bytes(b"mine")
    assert model_zoo.resolve_weights("torchvision/mask_rcnn_R_50_FPN") == "torchvision/mask_rcnn_R_50_FPN"
    assert lookup("torchvision/mask_rcnn_R_50_FPN") is None


def test_an_unknown_publisher_name_is_an_error_naming_the_catalog():
    with pytest.raises(FileNotFoundError, match="is no file, and no model called 'detectron2/mask_rcnn_R_50_FPN_9x'"):
        model_zoo.resolve_weights("detectron2/mask_rcnn_R_50_FPN_9x")
    assert model_zoo.resolve_weights("output/model_final.pth") == "output/model_final.pth"  # a path: as given
    with pytest.raises(ValueError, match="MODEL.WEIGHTS must be"):
        model_zoo.resolve_weights("")


def test_url_checksums_from_fragment_or_file_name():
    digest = "ab" * 32
    assert url_checksum(f"https://h/x.pth#sha256={digest}") == ("https://h/x.pth", Checksum("sha256", digest))
    assert url_checksum("https://h/resnet50-0676ba61.pth") == ("https://h/resnet50-0676ba61.pth", Checksum("sha256", "0676ba61"))
    assert url_checksum("https://h/model-2020.pth") == ("https://h/model-2020.pth", None)  # a year, not a digest
    assert url_checksum("https://h/model.pth") == ("https://h/model.pth", None)
    with pytest.raises(ValueError, match="#sha256=<8 to 64 hex digits>"):
        url_checksum("https://h/x.pth#md5=abcdef12")
    with pytest.raises(ValueError, match="#sha256=<8 to 64 hex digits>"):
        url_checksum("https://h/x.pth#sha256=abc")


def test_class_names_are_torchvisions_and_cocos():
    meta = TORCHVISION_WEIGHTS["torchvision/mask_rcnn_R_50_FPN"].meta
    # torchvision's list starts with its background; detcore moves background last.
    assert metadata("torchvision/mask_rcnn_R_50_FPN")["thing_classes"] == meta["categories"][1:]
    keypoints = TORCHVISION_WEIGHTS["torchvision/keypoint_rcnn_R_50_FPN"].meta
    got = metadata("torchvision/keypoint_rcnn_R_50_FPN")
    assert got["thing_classes"] == keypoints["categories"][1:] == ["person"]
    assert got["keypoint_names"] == keypoints["keypoint_names"]
    coco80 = metadata("detectron2/mask_rcnn_R_50_FPN_3x")["thing_classes"]
    assert len(coco80) == 80 and coco80[0] == "person" and coco80[-1] == "toothbrush" and "N/A" not in coco80
    assert set(coco80) == set(meta["categories"]) - {"__background__", "N/A"}
    assert metadata("torchvision/resnet50") == {}


def test_get_config_runs_the_preset_with_the_weights_named(monkeypatch):
    cfg = get_config("torchvision/keypoint_rcnn_R_50_FPN", device="cpu")
    assert cfg.MODEL.WEIGHTS == "torchvision/keypoint_rcnn_R_50_FPN"
    assert cfg.MODEL.KEYPOINT_ON and cfg.MODEL.ROI_HEADS.NUM_CLASSES == 1 and cfg.MODEL.DEVICE == "cpu"
    assert get_config_file("detectron2/COCO-Detection/retinanet_R_50_FPN_3x") == os.path.join(
        REPO, "configs", "detectron2", "retinanet_R_50_FPN_3x.yaml"
    )
    cfg = get_config("detectron2/ImageNetPretrained/MSRA/R-50")  # a body: the preset that trains from it
    assert cfg.MODEL.WEIGHTS == "detectron2/ImageNetPretrained/MSRA/R-50"
    with pytest.raises(ValueError, match="has no preset config in detcore"):
        get_config_file("torchvision/resnet18")


def test_register_refuses_taken_names(monkeypatch):
    monkeypatch.setattr(model_zoo, "CATALOG", dict(CATALOG))
    monkeypatch.setattr("detcore.checkpoint.catalog.CATALOG", model_zoo.CATALOG)
    entry = replace(CATALOG["torchvision/resnet50"], name="team/resnet50", aliases=("torchvision/resnet50",))
    with pytest.raises(ValueError, match="torchvision/resnet50 already in the catalog"):
        register(entry)
    register(replace(entry, aliases=()))
    assert get_entry("team/resnet50").url == CATALOG["torchvision/resnet50"].url
    with pytest.raises(TypeError, match="must be a ZooEntry"):
        register("team/resnet50")
    with pytest.raises(ValueError, match="url must start with https://"):
        ZooEntry("x", "ftp://h/x.pth", None, "none", "detcore", None, None)


def test_the_catalog_table_lists_every_entry():
    table = model_zoo.catalog_table().splitlines()
    assert len(table) == 2 + len(CATALOG)
    for entry, row in zip(CATALOG.values(), table[2:]):
        assert f"`{entry.name}`" in row and entry.url in row
        assert (entry.checksum.prefix in row) if entry.checksum else ("layout checked" in row)
