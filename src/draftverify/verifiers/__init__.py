"""Verifiers decide how much of a draft to keep; importing this package registers them all."""

from .base import Verifier
from .bild import BildVerifier
from .coupled import GumbelCouplingVerifier
from .exact import ExactVerifier
from .greedy import GreedyVerifier
from .rejection import SpeculativeSamplingVerifier
from .topbeta import TopBetaVerifier
from .tree import TreeGreedyVerifier, TreeSpeculativeSamplingVerifier

__all__ = [
    "Verifier",
    "GreedyVerifier",
    "SpeculativeSamplingVerifier",
    "BildVerifier",
    "TopBetaVerifier",
    "TreeGreedyVerifier",
    "TreeSpeculativeSamplingVerifier",
    "ExactVerifier",
    "GumbelCouplingVerifier",
]
