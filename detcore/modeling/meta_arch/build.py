"""META_ARCH_REGISTRY and build_model: the whole detector named by MODEL.META_ARCHITECTURE."""
from torch import nn

from detcore.utils import comm
from detcore.utils.registry import Registry

__all__ = ["META_ARCH_REGISTRY", "build_model"]

# Meta-architectures: `from_config(cfg)` builds the parts through their own registries.
META_ARCH_REGISTRY = Registry("META_ARCH", "MODEL.META_ARCHITECTURE")


def build_model(cfg) -> nn.Module:
    """The model named by cfg.MODEL.META_ARCHITECTURE, on cfg.MODEL.DEVICE."""
    device = comm.resolve_device(cfg.MODEL.DEVICE)
    return META_ARCH_REGISTRY.build(cfg).to(device)
