"""Meta-architectures (one file each) and the model builder; importing the package registers them."""
from .build import META_ARCH_REGISTRY, build_model
from .base import Detector
from .rcnn import GeneralizedRCNN
from .retinanet import RetinaNet

__all__ = ["META_ARCH_REGISTRY", "Detector", "GeneralizedRCNN", "RetinaNet", "build_model"]
