"""Dense heads: one-stage detectors' heads, which predict at every anchor of every feature level
(RetinaNet's class and box towers)."""
from .retinanet_head import RetinaNetHead

__all__ = ["RetinaNetHead"]
