"""The lossless rule for the sampling settings and the draft's shape, chosen per step.

Greedy at temperature 0, Gumbel-max coupling when sampling is coupled (seeded, by default: the text is then the
same for every method and draft length), speculative sampling otherwise; for a token tree, their tree versions. One object
serves a whole generation, so a method can be named "exact" without knowing whether its drafter proposes
chains or trees (a drafter may even switch, e.g. to a chain when it has only one candidate).
"""
from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier
from .coupled import GumbelCouplingVerifier
from .greedy import GreedyVerifier
from .rejection import SpeculativeSamplingVerifier
from .tree import TreeGreedyVerifier, TreeSpeculativeSamplingVerifier


class ExactVerifier(Verifier):
    supports_batch = True
    accepts_trees = True

    def __init__(self, params: SamplingParams, lenience: float = 1.0):
        if lenience != 1.0:
            self.chain: Verifier = SpeculativeSamplingVerifier(lenience)
        elif params.greedy:
            self.chain = GreedyVerifier()
        else:
            self.chain = GumbelCouplingVerifier() if params.coupled else SpeculativeSamplingVerifier()
        if params.greedy:
            self.tree: Verifier = TreeGreedyVerifier()
        else:
            self.tree = GumbelCouplingVerifier() if params.coupled else TreeSpeculativeSamplingVerifier()
        self.lenience = lenience
        self.lossless = self.chain.lossless

    @property
    def name(self) -> str:
        """The chain rule's name (greedy, gumbel_coupling, speculative_sampling): what a user reads in reports."""
        return self.chain.name

    def check_params(self, params: SamplingParams) -> None:
        self.chain.check_params(params)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        if draft.tree is None:
            return self.chain.verify(draft, target_logits, params, generator)
        if self.lenience != 1.0:
            raise DraftVerifyError("lenience applies to chain drafts only; tree drafts are verified exactly")
        self.tree.check_params(params)
        return self.tree.verify(draft, target_logits, params, generator)
