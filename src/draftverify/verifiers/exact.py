"""The lossless rule for the sampling settings and the draft's shape, chosen per step.

Greedy at temperature 0, Gumbel-max coupling when sampling is coupled (seeded, by default: the text is then the
same for every method and draft length), speculative sampling otherwise; for a token tree, their tree versions. One
object serves a whole generation, so a method can be named "exact" without knowing whether its drafter proposes
chains or trees (a drafter may even switch, e.g. to a chain when it has only one candidate).
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..sampling import RowParams, params_rows
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, verify_by_rows
from .coupled import GumbelCouplingVerifier
from .greedy import GreedyVerifier
from .rejection import SpeculativeSamplingVerifier
from .tree import TreeGreedyVerifier, TreeSpeculativeSamplingVerifier


class ExactVerifier(Verifier):
    """Per-row sampling settings (sampling.RowParams) are judged group by group, each group by its own rule, so a
    greedy row in a batch of sampled rows is still exactly greedy."""

    supports_batch = True
    accepts_trees = True
    per_row_params = True

    def __init__(self, params: SamplingParams | RowParams, lenience: float = 1.0):
        self.lenience = lenience
        self._rules: dict[tuple, tuple[Verifier, Verifier]] = {}
        self._last: tuple[SamplingParams, tuple[Verifier, Verifier]] | None = None
        first = params.rows[0] if isinstance(params, RowParams) else params
        self.chain, self.tree = self.rules(first)
        self.lossless = self.chain.lossless

    def rules(self, params: SamplingParams) -> tuple[Verifier, Verifier]:
        """(chain rule, tree rule) for one setting (the last one asked is answered without building its key: a
        generation asks every step)."""
        if self._last is not None and self._last[0] is params:
            return self._last[1]
        key = RowParams.key(params)
        if key not in self._rules:
            if self.lenience != 1.0:
                chain: Verifier = SpeculativeSamplingVerifier(self.lenience)
            elif params.greedy:
                chain = GreedyVerifier()
            else:
                chain = GumbelCouplingVerifier() if params.coupled else SpeculativeSamplingVerifier()
            if params.greedy:
                tree: Verifier = TreeGreedyVerifier()
            else:
                tree = GumbelCouplingVerifier() if params.coupled else TreeSpeculativeSamplingVerifier()
            self._rules[key] = (chain, tree)
        self._last = (params, self._rules[key])
        return self._last[1]

    @property
    def name(self) -> str:  # type: ignore[override]  # read-only by design: the chain rule in use names it
        """The chain rule's name (greedy, gumbel_coupling, speculative_sampling): what a user reads in reports."""
        return self.chain.name

    def check_params(self, params: SamplingParams | RowParams) -> None:
        for p in params_rows(params, 1):
            self.rules(p)[0].check_params(p)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params, generator) -> Verdict:
        if isinstance(params, RowParams):
            return verify_by_rows(self.verify, draft, target_logits, params, generator)
        last = self._last  # rules() inlined for the setting asked last: every step of a generation asks it
        chain, tree = last[1] if last is not None and last[0] is params else self.rules(params)
        if draft.tree is None:
            return chain.verify(draft, target_logits, params, generator)
        if self.lenience != 1.0:
            raise DraftVerifyError("lenience applies to chain drafts only; tree drafts are verified exactly")
        tree.check_params(params)
        return tree.verify(draft, target_logits, params, generator)
