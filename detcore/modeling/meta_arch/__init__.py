"""Meta-architectures (one file each) and the model builder; importing the package registers them."""
from .base import DetectorBase
from .build import META_ARCH_REGISTRY, build_model
from .proposal_network import ProposalNetwork
from .rcnn import GeneralizedRCNN
from .retinanet import RetinaNet

__all__ = ["META_ARCH_REGISTRY", "DetectorBase", "GeneralizedRCNN", "ProposalNetwork", "RetinaNet", "build_model"]
