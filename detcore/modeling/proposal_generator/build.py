"""PROPOSAL_GENERATOR_REGISTRY and build_proposal_generator."""
from typing import Dict

from detcore.layers.shape_spec import ShapeSpec
from detcore.utils.registry import Registry

__all__ = ["PROPOSAL_GENERATOR_REGISTRY", "build_proposal_generator"]

# Proposal generators: `from_config(cfg, input_shape)` gets the backbone's feature name ->
# ShapeSpec dict (a generator picks the levels it reads itself).
PROPOSAL_GENERATOR_REGISTRY = Registry("PROPOSAL_GENERATOR", "MODEL.PROPOSAL_GENERATOR.NAME")


def build_proposal_generator(cfg, input_shape: Dict[str, ShapeSpec]):
    """The proposal generator named by cfg.MODEL.PROPOSAL_GENERATOR.NAME for backbone outputs
    described by ``input_shape`` (importing the package registers the built-in ones)."""
    return PROPOSAL_GENERATOR_REGISTRY.build(cfg, input_shape)
