"""PROPOSAL_GENERATOR_REGISTRY and build_proposal_generator."""
from typing import Dict

from detcore.layers.shape_spec import ShapeSpec
from detcore.utils.registry import Registry

__all__ = ["PROPOSAL_GENERATOR_REGISTRY", "build_proposal_generator"]

# Proposal generators: classes with a from_config(cfg, input_shape) classmethod, selected by
# cfg.MODEL.PROPOSAL_GENERATOR.NAME (default "RPN" when the config has no such key).
PROPOSAL_GENERATOR_REGISTRY = Registry("PROPOSAL_GENERATOR")


def build_proposal_generator(cfg, input_shape: Dict[str, ShapeSpec]):
    """Build the proposal generator for backbone outputs described by ``input_shape``
    (feature name -> ShapeSpec; it picks the levels it reads itself)."""
    node = cfg.MODEL.get("PROPOSAL_GENERATOR", None)
    name = node.get("NAME", "RPN") if node is not None else "RPN"
    # Importing here registers the built-in generators without an import cycle (rpn.py imports
    # this module for the registry).
    from . import rpn  # noqa: F401

    return PROPOSAL_GENERATOR_REGISTRY.get(name).from_config(cfg, input_shape)
