"""Pictures of a model's detections: what ``tools/demo.py`` does, as functions.

    cfg = demo_config(model="torchvision/mask_rcnn_R_50_FPN")   # or config_file=..., opts=[...]
    paths = collect_image_paths(["imgs/", "more/*.jpg", "one.png"])
    written = visualize_images(Predictor(cfg), paths, "out/", **demo_metadata(cfg))
"""
import glob
import logging
import os
from typing import Callable, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from detcore.checkpoint import model_zoo
from detcore.config import get_cfg
from detcore.data import MetadataCatalog
from detcore.structures import Instances
from detcore.utils.visualizer import draw_instances, upscale_factor

__all__ = ["IMAGE_EXTENSIONS", "collect_image_paths", "demo_config", "demo_metadata", "visualize_images"]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def _is_image(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith(IMAGE_EXTENSIONS)


def collect_image_paths(inputs: Sequence[str]) -> List[str]:
    """Image files named by ``inputs``: folders (their image files, sorted; not recursive),
    files, or glob patterns (quote them in the shell, or let the shell expand them). Each file
    appears once, in the order given. An input that names nothing is an error."""
    if isinstance(inputs, str):
        inputs = [inputs]
    paths: List[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(os.path.join(item, n) for n in os.listdir(item) if _is_image(os.path.join(item, n)))
            what = f"folder {item!r} holds no image files ({', '.join(IMAGE_EXTENSIONS)})"
        elif os.path.isfile(item):
            found = [item]
            what = ""
        else:
            found = sorted(p for p in glob.glob(item) if _is_image(p))
            what = f"{item!r} is not a file or folder, and as a glob pattern it matches no image file"
        if not found:
            raise FileNotFoundError(f"--input: {what}")
        paths += found
    seen = set()
    return [p for p in paths if not (os.path.abspath(p) in seen or seen.add(os.path.abspath(p)))]


def demo_config(config_file: Optional[str] = None, model: Optional[str] = None, opts: Sequence[str] = ()):
    """The demo's config: ``config_file`` merged, or without one the preset of catalog model
    ``model`` (model_zoo.get_config: on the CPU when this machine has no GPU); ``model`` becomes
    MODEL.WEIGHTS; ``opts`` (KEY VALUE ...) are merged last."""
    if config_file:
        cfg = get_cfg()
        cfg.merge_from_file(config_file)
        if model:
            cfg.MODEL.WEIGHTS = model
    elif model:
        if model_zoo.lookup(model) is None and model.startswith(("https://", "http://")):
            raise ValueError(f"--model {model} is a URL outside detcore's catalog: it has no preset, give --config-file too")
        cfg = model_zoo.get_config(model)
    else:
        raise ValueError("give a config file (--config-file), a catalog model (--model), or both")
    cfg.merge_from_list(list(opts))
    return cfg


def demo_metadata(cfg) -> dict:
    """Names to draw with: ``class_names``, ``keypoint_names``, ``keypoint_skeleton``. Those of
    the catalog entry MODEL.WEIGHTS names (what the weights predict; torchvision's models count
    COCO category ids, not COCO's 80 classes) when its class count is the model's, else the
    metadata of the first DATASETS.TEST."""
    num_classes = cfg.MODEL.RETINANET.NUM_CLASSES if cfg.MODEL.META_ARCHITECTURE == "RetinaNet" else cfg.MODEL.ROI_HEADS.NUM_CLASSES
    meta = {}
    if model_zoo.lookup(cfg.MODEL.WEIGHTS) is not None:
        meta = model_zoo.metadata(cfg.MODEL.WEIGHTS)
        if len(meta.get("thing_classes", ())) != num_classes:
            meta = {}
    if not meta and cfg.DATASETS.TEST:
        found = MetadataCatalog.get(cfg.DATASETS.TEST[0])
        meta = {k: found.get(k) for k in ("thing_classes", "keypoint_names", "keypoint_skeleton")}
    return {
        "class_names": meta.get("thing_classes"),
        "keypoint_names": meta.get("keypoint_names"),
        "keypoint_skeleton": meta.get("keypoint_skeleton"),
    }


def _output_name(path: str, used: set) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    name, k = f"{stem}.png", 1
    while name in used:  # same file name in two input folders
        name, k = f"{stem}_{k}.png", k + 1
    used.add(name)
    return name


def visualize_images(
    predictor: Callable[[np.ndarray], dict],
    paths: Sequence[str],
    output_dir: str,
    class_names: Optional[Sequence[str]] = None,
    score_threshold: float = 0.5,
    min_size: int = 480,
    keypoint_names: Optional[Sequence[str]] = None,
    keypoint_skeleton: Optional[Sequence[Tuple[str, str]]] = None,
    keypoint_threshold: Optional[float] = None,
) -> List[str]:
    """Run ``predictor`` (BGR uint8 image -> dict with "instances") on each image and write the
    image with its detections drawn (boxes, masks, keypoints on their skeleton, class names,
    scores) as a PNG into ``output_dir``. A ProposalNetwork's predictor gives "proposals" instead:
    they are drawn as boxes scored by sigmoid(objectness). Images whose short side is under
    ``min_size`` pixels are drawn enlarged by a whole factor to at least that (``upscale_factor``;
    0: every image at its own size), so that labels do not hide small objects. Returns the
    written paths."""
    os.makedirs(output_dir, exist_ok=True)
    used: set = set()
    written = []
    for path in paths:
        image = cv2.imread(path, cv2.IMREAD_COLOR)
        if image is None:
            raise OSError(f"could not read image {path!r} (unsupported or corrupt file)")
        prediction = predictor(image)
        if "instances" in prediction:
            instances = prediction["instances"].to("cpu")
        else:
            proposals = prediction["proposals"].to("cpu")
            instances = Instances(
                proposals.image_size,
                pred_boxes=proposals.proposal_boxes,
                scores=proposals.objectness_logits.sigmoid(),
            )
        scale = upscale_factor(image.shape[0], image.shape[1], min_size)
        drawn = draw_instances(
            image, instances, class_names=class_names, score_threshold=score_threshold, scale=scale,
            keypoint_names=keypoint_names, keypoint_skeleton=keypoint_skeleton, keypoint_threshold=keypoint_threshold,
        )
        out = os.path.join(output_dir, _output_name(path, used))
        if not cv2.imwrite(out, drawn):
            raise OSError(f"could not write {out!r}")
        kept = int((instances.scores >= score_threshold).sum()) if instances.has("scores") else len(instances)
        logger.info(
            "%s: %d detections (score >= %.2f) -> %s%s", path, kept, score_threshold, out,
            f" (drawn {scale}x enlarged)" if scale > 1 else "",
        )
        written.append(out)
    return written
