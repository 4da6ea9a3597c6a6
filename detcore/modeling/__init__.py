"""Model components: backbones (more to come: RPN, ROI heads, meta-architectures)."""
from .backbone import BACKBONE_REGISTRY, build_backbone

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]
