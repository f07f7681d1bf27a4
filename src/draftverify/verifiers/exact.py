"""The lossless rule for the sampling settings and the draft's shape, chosen per step.

Greedy at temperature 0, speculative sampling otherwise; for a token tree, their tree versions. One object
serves a whole generation, so a method can be named "exact" without knowing whether its drafter proposes
chains or trees (a drafter may even switch, e.g. to a chain when it has only one candidate).
"""
from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier
from .greedy import GreedyVerifier
from .rejection import SpeculativeSamplingVerifier
from .tree import TreeGreedyVerifier, TreeSpeculativeSamplingVerifier


class ExactVerifier(Verifier):
    name = "exact"
    accepts_trees = True

    def __init__(self, params: SamplingParams, lenience: float = 1.0):
        greedy = params.greedy and lenience == 1.0
        self.chain: Verifier = GreedyVerifier() if greedy else SpeculativeSamplingVerifier(lenience)
        self.tree: Verifier = TreeGreedyVerifier() if params.greedy else TreeSpeculativeSamplingVerifier()
        self.lenience = lenience
        self.lossless = self.chain.lossless

    def check_params(self, params: SamplingParams) -> None:
        self.chain.check_params(params)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        if draft.tree is None:
            return self.chain.verify(draft, target_logits, params, generator)
        if self.lenience != 1.0:
            raise DraftVerifyError("lenience applies to chain drafts only; tree drafts are verified exactly")
        self.tree.check_params(params)
        return self.tree.verify(draft, target_logits, params, generator)
