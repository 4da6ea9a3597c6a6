"""The model's class count against the datasets it trains and is evaluated on, checked before
anything is built or read: a mismatch otherwise surfaces as an index error deep in a loss, or
not at all (a model with too many outputs trains, and its extra classes are never right).

The count is the config's foreground classes, background not counted, whatever the
architecture: MODEL.ROI_HEADS.NUM_CLASSES (R-CNN; the background class is the implicit extra
index NUM_CLASSES) or MODEL.RETINANET.NUM_CLASSES (RetinaNet: one sigmoid per class, no
background). A ProposalNetwork has no classes. A dataset's classes are its metadata's
``thing_classes``; a dataset registered without them is not checked.
"""
from typing import Optional, Sequence

from detcore.data import MetadataCatalog
from detcore.modeling import META_ARCH_REGISTRY, ProposalNetwork, RetinaNet

__all__ = ["num_classes_key", "check_dataset_classes"]


def num_classes_key(cfg) -> Optional[str]:
    """The config key holding the model's class count (None: a model without classes)."""
    arch = META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE)
    if isinstance(arch, type) and issubclass(arch, ProposalNetwork):
        return None
    if isinstance(arch, type) and issubclass(arch, RetinaNet):
        return "MODEL.RETINANET.NUM_CLASSES"
    return "MODEL.ROI_HEADS.NUM_CLASSES"


def _show(classes: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(repr(c) for c in list(classes)[:limit])
    return f"[{shown}{', ...' if len(classes) > limit else ''}]"


def check_dataset_classes(cfg, dataset_names: Sequence[str]) -> None:
    """Every named dataset has exactly the model's class count, and all of them the same class
    names in the same order (a model trained on one and scored on another must mean the same
    thing by class k). Errors name the datasets, the numbers and the key to set."""
    key = num_classes_key(cfg)
    num_classes = None
    if key is not None:
        node = cfg
        for part in key.split(".")[:-1]:
            node = getattr(node, part)
        num_classes = getattr(node, key.rsplit(".", 1)[1])
    first = None
    for name in dict.fromkeys(dataset_names):  # each name once, in order
        classes = MetadataCatalog.get(name).get("thing_classes")
        if classes is None:
            continue
        classes = list(classes)
        if num_classes is not None and len(classes) != num_classes:
            raise ValueError(
                f"{key} is {num_classes}, but dataset '{name}' has {len(classes)} classes {_show(classes)}; "
                f"set {key} {len(classes)} (the background class is not counted)"
            )
        if first is not None and classes != first[1]:
            raise ValueError(
                f"Datasets '{first[0]}' and '{name}' have different classes ({_show(first[1])} vs {_show(classes)}): "
                f"a model trained or evaluated on both would mix up class indices"
            )
        first = first or (name, classes)
