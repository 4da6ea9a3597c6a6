"""What a keypoint dataset says about its keypoints, as dataset metadata.

A COCO keypoint json describes them in its categories: ``"keypoints"`` (the K names, in order)
and ``"skeleton"`` (1-based index pairs to draw as lines). detcore reads two more optional
category fields, which its own generated data writes: ``"keypoint_flip_map"`` (pairs of names
that swap in a mirror image) and ``"keypoint_oks_sigmas"`` (the K per-keypoint constants of
COCO's object keypoint similarity). They become the metadata keys

    keypoint_names            [K] names
    keypoint_skeleton         [(name, name), ...] lines to draw
    keypoint_flip_map         [(left name, right name), ...]; without the field, the names that
                              differ only by "left" / "right" (COCO's "left_eye" / "right_eye")
    keypoint_oks_sigmas       [K] floats; without the field, COCO's when the names are COCO's

which the data mapper (flips), the visualizer (skeleton) and the COCO evaluator (OKS) read.
"""
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "COCO_PERSON_KEYPOINT_NAMES",
    "COCO_PERSON_SKELETON",
    "COCO_PERSON_OKS_SIGMAS",
    "coco_person_keypoint_metadata",
    "infer_flip_map",
    "keypoint_metadata_from_categories",
]

COCO_PERSON_KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip",
    "left_knee", "right_knee", "left_ankle", "right_ankle",
)  # fmt: skip
# The "skeleton" of COCO's person category (1-based keypoint indices), as in its json files.
_COCO_PERSON_SKELETON_INDICES = (
    (16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8), (7, 9),
    (8, 10), (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7),
)  # fmt: skip
COCO_PERSON_SKELETON = [
    (COCO_PERSON_KEYPOINT_NAMES[a - 1], COCO_PERSON_KEYPOINT_NAMES[b - 1]) for a, b in _COCO_PERSON_SKELETON_INDICES
]
# COCO's per-keypoint OKS constants (pycocotools' defaults; Ronchi & Perona, 2017).
COCO_PERSON_OKS_SIGMAS = [
    v / 10.0 for v in (0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07, 0.87, 0.87, 0.89, 0.89)
]

_LEFT = re.compile(r"(?i)left")


def infer_flip_map(names: Sequence[str]) -> List[Tuple[str, str]]:
    """(left, right) pairs of names that are the same with "left" written "right" (in the same
    case): ("left_eye", "right_eye"), ("LeftHand", "RightHand")."""
    present = set(names)
    pairs = []
    for name in names:
        partner = _LEFT.sub(lambda m: _right_like(m.group(0)), name)
        if partner != name and partner in present:
            pairs.append((name, partner))
    return pairs


def _right_like(left: str) -> str:
    """"right" written in the case of ``left`` ("left", "Left" or "LEFT")."""
    if left.isupper():
        return "RIGHT"
    return "Right" if left[0].isupper() else "right"


def coco_person_keypoint_metadata() -> Dict[str, Any]:
    """The keypoint metadata of COCO's person keypoints (what their json's categories give)."""
    names = list(COCO_PERSON_KEYPOINT_NAMES)
    return {
        "keypoint_names": names,
        "keypoint_skeleton": list(COCO_PERSON_SKELETON),
        "keypoint_flip_map": infer_flip_map(names),
        "keypoint_oks_sigmas": list(COCO_PERSON_OKS_SIGMAS),
    }


def _names_of(category: dict, where: str) -> Optional[List[str]]:
    names = category.get("keypoints")
    if names is None:
        return None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{where}: 'keypoints' must be a non-empty list of keypoint names, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: keypoint names must be unique, got {names}")
    return names


def keypoint_metadata_from_categories(categories: Sequence[dict], source: str) -> Dict[str, Any]:
    """The metadata (see the module docstring) of the COCO categories that declare keypoints;
    {} when none does. All of them must declare the same keypoints: Keypoint R-CNN predicts one
    set of K points for every class. Errors name ``source`` (the json file) and the category."""
    found: Optional[Dict[str, Any]] = None
    for category in categories:
        where = f"{source}: category {category.get('id')!r} ({category.get('name')!r})"
        names = _names_of(category, where)
        if names is None:
            continue
        meta = {
            "keypoint_names": names,
            "keypoint_skeleton": _skeleton(category.get("skeleton", []), names, where),
            "keypoint_flip_map": _flip_map(category.get("keypoint_flip_map"), names, where),
            "keypoint_oks_sigmas": _sigmas(category.get("keypoint_oks_sigmas"), names, where),
        }
        if found is None:
            found = meta
        elif meta != found:
            raise ValueError(
                f"{where}: declares other keypoints (or skeleton, flip map, sigmas) than an earlier category; "
                "Keypoint R-CNN needs one keypoint set for all classes"
            )
    return found or {}


def _skeleton(skeleton: Any, names: List[str], where: str) -> List[Tuple[str, str]]:
    if not isinstance(skeleton, list):
        raise ValueError(f"{where}: 'skeleton' must be a list of [i, j] pairs of 1-based keypoint indices, got {skeleton!r}")
    out = []
    for pair in skeleton:
        ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
        if not ok or not all(1 <= i <= len(names) for i in pair):
            raise ValueError(
                f"{where}: 'skeleton' entries must be [i, j] with 1 <= i, j <= {len(names)} (1-based keypoint "
                f"indices), got {pair!r}"
            )
        out.append((names[pair[0] - 1], names[pair[1] - 1]))
    return out


def _flip_map(flip_map: Any, names: List[str], where: str) -> List[Tuple[str, str]]:
    if flip_map is None:
        return infer_flip_map(names)
    pairs = []
    for pair in flip_map if isinstance(flip_map, list) else [flip_map]:
        if not (isinstance(pair, list) and len(pair) == 2 and all(n in names for n in pair)) or pair[0] == pair[1]:
            raise ValueError(
                f"{where}: 'keypoint_flip_map' entries must be [left name, right name] pairs of two different "
                f"keypoint names, got {pair!r}"
            )
        pairs.append((pair[0], pair[1]))
    used = [n for pair in pairs for n in pair]
    if len(set(used)) != len(used):
        raise ValueError(f"{where}: a keypoint appears in more than one 'keypoint_flip_map' pair: {flip_map}")
    return pairs


def _sigmas(sigmas: Any, names: List[str], where: str) -> Optional[List[float]]:
    if sigmas is None:
        return list(COCO_PERSON_OKS_SIGMAS) if tuple(names) == COCO_PERSON_KEYPOINT_NAMES else None
    ok = isinstance(sigmas, list) and len(sigmas) == len(names)
    ok = ok and all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in sigmas)
    if not ok:
        raise ValueError(f"{where}: 'keypoint_oks_sigmas' must be {len(names)} positive numbers (one per keypoint), got {sigmas!r}")
    return [float(s) for s in sigmas]
