"""The model zoo catalog: published checkpoints that detcore's presets run, by name.

Each entry is the publisher's URL and checksum (never one made up here), the layout the file has
(one of detcore.checkpoint.FORMATS), the preset config that runs it as its publisher did (path
under configs/), and the class set it predicts. Names follow the presets' paths
(``torchvision/mask_rcnn_R_50_FPN`` runs with configs/torchvision/mask_rcnn_R_50_FPN.yaml) or,
for detectron2, its own model zoo names (``detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x``,
also reachable as ``detectron2/mask_rcnn_R_50_FPN_3x``, the preset's path).

Where each URL and checksum comes from:

* torchvision: the weight enums of torchvision/models/detection/{mask_rcnn,faster_rcnn,
  keypoint_rcnn,retinanet}.py and torchvision/models/resnet.py (``*_Weights.COCO_V1.url``,
  ``*_Weights.IMAGENET1K_V1.url``; torchvision 0.29, installed here, where tests compare them).
  The checksum is torch's hash-in-the-file-name convention: the hex digits between the last
  '-' and the extension are a prefix of the file's sha256 (torch.hub ``HASH_REGEX``,
  ``download_url_to_file(hash_prefix=...)``), which torchvision's builders verify
  (``weights.get_state_dict(progress=progress, check_hash=True)``).
* detectron2: ``_ModelZooUrls.CONFIG_PATH_TO_URL_SUFFIX`` of detectron2/model_zoo/model_zoo.py
  (facebookresearch/detectron2, checked at commit 03cd759c) and the download links of
  MODEL_ZOO.md, which agree with it. Older MODEL_ZOO.md revisions link RetinaNet files of an
  earlier training (137593951 / 137849486 / 138363263); the catalog has the ones model_zoo.py
  names (190397773 / 190397829 / 190397697).
  MODEL_ZOO.md: "any model on this page contains its md5 prefix in its file name": the six hex
  digits of ``model_final_<md5 prefix>.pkl`` are the checksum.
* detectron2's ImageNet bodies (MODEL_ZOO.md, "ImageNet Pretrained Models": MSRA R-50.pkl,
  R-101.pkl, FAIR X-101-32x8d.pkl): no checksum is published, in the file name or elsewhere.
  What is verified instead: the downloaded file must read safely and be recognized as the
  layout the entry names (caffe2 blob names of a ResNet); its sha256 is then recorded beside
  the cached file, so a later change of the cached bytes is detected (download.py).

A test (or a company mirror serving other files) replaces entries with ``dataclasses.replace``
on a copy: ``monkeypatch.setitem(CATALOG, name, replace(CATALOG[name], checksum=...))``;
``register`` adds new ones.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

__all__ = ["CATALOG", "CLASS_SETS", "Checksum", "ZooEntry", "register"]

# What a model predicts, by name (model_zoo.metadata() turns them into class names):
#   "coco"              COCO's 80 thing classes, in category id order (detectron2's models)
#   "coco_category_ids" 90 classes: class k is COCO category id k + 1, the 10 ids COCO leaves
#                       unused named "N/A" (torchvision's models)
#   "coco_person"       person, with COCO's 17 keypoints and skeleton
# ImageNet bodies have none (None): they are a start for training, not a detector.
CLASS_SETS = ("coco", "coco_category_ids", "coco_person")
# Layouts of the files (detcore.checkpoint.FORMATS), named here without importing the converters.
_TV_DET, _TV_RESNET, _D2, _C2_RESNET = "torchvision-detection", "torchvision-resnet", "detectron2", "caffe2-resnet"


@dataclass(frozen=True)
class Checksum:
    """A digest the publisher gives, or its first hex digits: ``hashlib.<algorithm>`` of the file
    must start with ``prefix``."""

    algorithm: str
    prefix: str

    def __post_init__(self):
        if self.algorithm not in ("sha256", "md5"):
            raise ValueError(f"Checksum: algorithm must be 'sha256' or 'md5', got {self.algorithm!r}")
        full = 64 if self.algorithm == "sha256" else 32
        prefix = self.prefix.lower()
        if not (6 <= len(prefix) <= full and all(c in "0123456789abcdef" for c in prefix)):
            raise ValueError(f"Checksum: prefix must be 6 to {full} hex digits of a {self.algorithm}, got {self.prefix!r}")
        object.__setattr__(self, "prefix", prefix)

    def matches(self, hexdigest: str) -> bool:
        return hexdigest.lower().startswith(self.prefix)

    def __str__(self) -> str:
        return f"{self.algorithm} {self.prefix}" + ("" if len(self.prefix) in (32, 64) else "...")


@dataclass(frozen=True)
class ZooEntry:
    """One published checkpoint.

    Attributes:
        name: the catalog name (what MODEL.WEIGHTS and ``--model`` take).
        url: the publisher's URL.
        checksum: the publisher's checksum, or None where it publishes none.
        checksum_source: where the checksum comes from, or why there is none.
        format: the layout the file has (one of detcore.checkpoint.FORMATS); a file without a
            published checksum must be recognized as it before it is used.
        config: the preset (path under configs/) that runs the weights as their publisher did,
            or, for an ImageNet body, a preset that trains from it; None where none does.
        classes: the class set it predicts (one of CLASS_SETS), None for an ImageNet body.
        aliases: other names for it.
    """

    name: str
    url: str
    checksum: Optional[Checksum]
    checksum_source: str
    format: str
    config: Optional[str]
    classes: Optional[str]
    aliases: Tuple[str, ...] = field(default=())

    def __post_init__(self):
        if self.classes is not None and self.classes not in CLASS_SETS:
            raise ValueError(f"ZooEntry {self.name}: classes must be one of {CLASS_SETS} or None, got {self.classes!r}")
        if not self.url.startswith(("https://", "http://")):
            raise ValueError(f"ZooEntry {self.name}: url must start with https:// or http://, got {self.url!r}")


_TORCH_HASH = "sha256 prefix in the file name (torch.hub convention; torchvision checks it with check_hash=True)"
_D2_MD5 = "md5 prefix in the file name (detectron2 MODEL_ZOO.md: 'contains its md5 prefix in its file name')"
_D2_NONE = "none published (detectron2 MODEL_ZOO.md gives the link only): verified by layout, sha256 recorded at download"


def _torchvision(name, url, format, config, classes, builder=None):
    digits = url.rsplit("-", 1)[1].split(".", 1)[0]
    aliases = (f"torchvision/{builder}",) if builder else ()
    return ZooEntry(name, url, Checksum("sha256", digits), _TORCH_HASH, format, config, classes, aliases)


def _detectron2(zoo_name, url, config, classes):
    digits = url.rsplit("_", 1)[1].split(".", 1)[0]
    short = "detectron2/" + zoo_name.split("/", 1)[1]
    return ZooEntry(f"detectron2/{zoo_name}", url, Checksum("md5", digits), _D2_MD5, _D2, config, classes, (short,))


_ENTRIES = (
    # --- torchvision COCO detectors: torchvision/models/detection/*.py, *_Weights.COCO_V1 ---------
    # mask_rcnn.py: MaskRCNN_ResNet50_FPN_Weights.COCO_V1
    _torchvision("torchvision/mask_rcnn_R_50_FPN",
                 "https://download.pytorch.org/models/maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth",
                 _TV_DET, "torchvision/mask_rcnn_R_50_FPN.yaml", "coco_category_ids", "maskrcnn_resnet50_fpn"),
    # faster_rcnn.py: FasterRCNN_ResNet50_FPN_Weights.COCO_V1
    _torchvision("torchvision/faster_rcnn_R_50_FPN",
                 "https://download.pytorch.org/models/fasterrcnn_resnet50_fpn_coco-258fb6c6.pth",
                 _TV_DET, "torchvision/faster_rcnn_R_50_FPN.yaml", "coco_category_ids", "fasterrcnn_resnet50_fpn"),
    # keypoint_rcnn.py: KeypointRCNN_ResNet50_FPN_Weights.COCO_V1 (its DEFAULT)
    _torchvision("torchvision/keypoint_rcnn_R_50_FPN",
                 "https://download.pytorch.org/models/keypointrcnn_resnet50_fpn_coco-fc266e95.pth",
                 _TV_DET, "torchvision/keypoint_rcnn_R_50_FPN.yaml", "coco_person", "keypointrcnn_resnet50_fpn"),
    # retinanet.py: RetinaNet_ResNet50_FPN_Weights.COCO_V1
    _torchvision("torchvision/retinanet_R_50_FPN",
                 "https://download.pytorch.org/models/retinanet_resnet50_fpn_coco-eeacb38b.pth",
                 _TV_DET, "torchvision/retinanet_R_50_FPN.yaml", "coco_category_ids", "retinanet_resnet50_fpn"),
    # --- torchvision ImageNet bodies: torchvision/models/resnet.py, *_Weights.IMAGENET1K_V1 --------
    # (V1: the weights torchvision's detection builders start from, weights_backbone=IMAGENET1K_V1.)
    _torchvision("torchvision/resnet18", "https://download.pytorch.org/models/resnet18-f37072fd.pth",
                 _TV_RESNET, None, None),
    _torchvision("torchvision/resnet34", "https://download.pytorch.org/models/resnet34-b627a593.pth",
                 _TV_RESNET, None, None),
    _torchvision("torchvision/resnet50", "https://download.pytorch.org/models/resnet50-0676ba61.pth",
                 _TV_RESNET, "torchvision/mask_rcnn_R_50_FPN.yaml", None),
    _torchvision("torchvision/resnet101", "https://download.pytorch.org/models/resnet101-63fe2227.pth",
                 _TV_RESNET, None, None),
    _torchvision("torchvision/resnet152", "https://download.pytorch.org/models/resnet152-394f9c45.pth",
                 _TV_RESNET, None, None),
    _torchvision("torchvision/resnext101_32x8d", "https://download.pytorch.org/models/resnext101_32x8d-8ba56ff5.pth",
                 _TV_RESNET, None, None),
    # --- detectron2 COCO models: model_zoo.py CONFIG_PATH_TO_URL_SUFFIX, MODEL_ZOO.md links --------
    # COCO Instance Segmentation Baselines with Mask R-CNN
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_50_C4_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_C4_1x/137259246/model_final_9243eb.pkl",
                "detectron2/mask_rcnn_R_50_C4_1x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_1x/137260431/model_final_a54504.pkl",
                "detectron2/mask_rcnn_R_50_FPN_1x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_50_C4_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_C4_3x/137849525/model_final_4ce675.pkl",
                "detectron2/mask_rcnn_R_50_C4_3x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x/137849600/model_final_f10217.pkl",
                "detectron2/mask_rcnn_R_50_FPN_3x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_101_C4_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_101_C4_3x/138363239/model_final_a2914c.pkl",
                "detectron2/mask_rcnn_R_101_C4_3x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_R_101_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_101_FPN_3x/138205316/model_final_a3ec72.pkl",
                "detectron2/mask_rcnn_R_101_FPN_3x.yaml", "coco"),
    _detectron2("COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-InstanceSegmentation/mask_rcnn_X_101_32x8d_FPN_3x/139653917/model_final_2d9806.pkl",
                "detectron2/mask_rcnn_X_101_32x8d_FPN_3x.yaml", "coco"),
    # COCO Detection with Faster R-CNN
    _detectron2("COCO-Detection/faster_rcnn_R_50_C4_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_C4_1x/137257644/model_final_721ade.pkl",
                "detectron2/faster_rcnn_R_50_C4_1x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_R_50_FPN_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_FPN_1x/137257794/model_final_b275ba.pkl",
                "detectron2/faster_rcnn_R_50_FPN_1x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_R_50_C4_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_C4_3x/137849393/model_final_f97cb7.pkl",
                "detectron2/faster_rcnn_R_50_C4_3x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_R_50_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_50_FPN_3x/137849458/model_final_280758.pkl",
                "detectron2/faster_rcnn_R_50_FPN_3x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_R_101_C4_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_101_C4_3x/138204752/model_final_298dad.pkl",
                "detectron2/faster_rcnn_R_101_C4_3x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_R_101_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_R_101_FPN_3x/137851257/model_final_f6e8b1.pkl",
                "detectron2/faster_rcnn_R_101_FPN_3x.yaml", "coco"),
    _detectron2("COCO-Detection/faster_rcnn_X_101_32x8d_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/faster_rcnn_X_101_32x8d_FPN_3x/139173657/model_final_68b088.pkl",
                "detectron2/faster_rcnn_X_101_32x8d_FPN_3x.yaml", "coco"),
    # COCO Detection with RetinaNet
    _detectron2("COCO-Detection/retinanet_R_50_FPN_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/retinanet_R_50_FPN_1x/190397773/model_final_bfca0b.pkl",
                "detectron2/retinanet_R_50_FPN_1x.yaml", "coco"),
    _detectron2("COCO-Detection/retinanet_R_50_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/retinanet_R_50_FPN_3x/190397829/model_final_5bd44e.pkl",
                "detectron2/retinanet_R_50_FPN_3x.yaml", "coco"),
    _detectron2("COCO-Detection/retinanet_R_101_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Detection/retinanet_R_101_FPN_3x/190397697/model_final_971ab9.pkl",
                "detectron2/retinanet_R_101_FPN_3x.yaml", "coco"),
    # COCO Person Keypoint Detection Baselines with Keypoint R-CNN
    _detectron2("COCO-Keypoints/keypoint_rcnn_R_50_FPN_1x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Keypoints/keypoint_rcnn_R_50_FPN_1x/137261548/model_final_04e291.pkl",
                "detectron2/keypoint_rcnn_R_50_FPN_1x.yaml", "coco_person"),
    _detectron2("COCO-Keypoints/keypoint_rcnn_R_50_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Keypoints/keypoint_rcnn_R_50_FPN_3x/137849621/model_final_a6e10b.pkl",
                "detectron2/keypoint_rcnn_R_50_FPN_3x.yaml", "coco_person"),
    _detectron2("COCO-Keypoints/keypoint_rcnn_R_101_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Keypoints/keypoint_rcnn_R_101_FPN_3x/138363331/model_final_997cc7.pkl",
                "detectron2/keypoint_rcnn_R_101_FPN_3x.yaml", "coco_person"),
    _detectron2("COCO-Keypoints/keypoint_rcnn_X_101_32x8d_FPN_3x",
                "https://dl.fbaipublicfiles.com/detectron2/COCO-Keypoints/keypoint_rcnn_X_101_32x8d_FPN_3x/139686956/model_final_5ad38f.pkl",
                "detectron2/keypoint_rcnn_X_101_32x8d_FPN_3x.yaml", "coco_person"),
    # --- detectron2 ImageNet bodies: MODEL_ZOO.md "ImageNet Pretrained Models" --------------------
    ZooEntry("detectron2/ImageNetPretrained/MSRA/R-50",
             "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-50.pkl",
             None, _D2_NONE, _C2_RESNET, "detectron2/mask_rcnn_R_50_FPN_3x.yaml", None),
    ZooEntry("detectron2/ImageNetPretrained/MSRA/R-101",
             "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-101.pkl",
             None, _D2_NONE, _C2_RESNET, "detectron2/mask_rcnn_R_101_FPN_3x.yaml", None),
    ZooEntry("detectron2/ImageNetPretrained/FAIR/X-101-32x8d",
             "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/FAIR/X-101-32x8d.pkl",
             None, _D2_NONE, _C2_RESNET, "detectron2/mask_rcnn_X_101_32x8d_FPN_3x.yaml", None),
)  # fmt: skip

# name -> entry. Look names up through model_zoo.get_entry, which also knows the aliases.
CATALOG: Dict[str, ZooEntry] = {e.name: e for e in _ENTRIES}


def register(entry: ZooEntry, *, replace: bool = False) -> None:
    """Add ``entry`` to the catalog (e.g. weights a team publishes on its own server). A name or
    alias already taken is an error unless ``replace``."""
    if not isinstance(entry, ZooEntry):
        raise TypeError(f"register: entry must be a ZooEntry, got {type(entry).__name__}")
    if not replace:
        taken = {entry.name, *entry.aliases} & ({n for n in CATALOG} | {a for e in CATALOG.values() for a in e.aliases})
        if taken:
            raise ValueError(f"register: {', '.join(sorted(taken))} already in the catalog (pass replace=True to replace)")
    CATALOG[entry.name] = entry
