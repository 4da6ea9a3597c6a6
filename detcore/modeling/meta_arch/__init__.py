"""Meta-architectures (one file each) and the model builder; importing the package registers them."""
from .build import META_ARCH_REGISTRY, build_model
from .base import Detector
from .rcnn import GeneralizedRCNN

__all__ = ["META_ARCH_REGISTRY", "Detector", "GeneralizedRCNN", "build_model"]
