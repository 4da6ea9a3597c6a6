"""Proposal generators: the RPN, its heads, and their registries."""
from .build import PROPOSAL_GENERATOR_REGISTRY, build_proposal_generator
from .rpn import RPN, find_top_rpn_proposals
from .rpn_head import RPN_HEAD_REGISTRY, StandardRPNHead, build_rpn_head

__all__ = [
    "PROPOSAL_GENERATOR_REGISTRY",
    "build_proposal_generator",
    "RPN",
    "find_top_rpn_proposals",
    "RPN_HEAD_REGISTRY",
    "StandardRPNHead",
    "build_rpn_head",
]
