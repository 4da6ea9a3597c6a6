"""Meta-architectures (one file each) and the model builder; importing the package registers them."""
from .build import META_ARCH_REGISTRY, build_model
from .rcnn import GeneralizedRCNN

__all__ = ["META_ARCH_REGISTRY", "GeneralizedRCNN", "build_model"]
