"""BiLD rollback policy (Kim et al., section 3.4, Algorithm 1).

d_i = cross-entropy between the draft's hard label x_i and the target's soft label p_L,i, i.e. -log p_L,i(x_i).
The first i with d_i > alpha_RB is rolled back: x_i and everything after are dropped and replaced by the
target's own token. Not lossless: draft tokens the target finds merely plausible are kept.
"""

from __future__ import annotations

import torch

from ..errors import check_number
from ..registry import register_verifier
from ..sampling import choose
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, accepted_prefix_length, gather_at, make_verdict


@register_verifier("bild")
class BildVerifier(Verifier):
    def __init__(self, rollback_threshold: float = 2.0):
        self.rollback_threshold = check_number("rollback threshold alpha_RB", rollback_threshold, 0.0)

    @classmethod
    def from_options(cls, options) -> "BildVerifier":
        return cls(rollback_threshold=options.alpha_rb)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        x = draft.tokens  # [B, N]
        log_p = target_logits[:, : draft.length].float().log_softmax(dim=-1)  # [B, N, V]
        distance = -log_p.gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        n = accepted_prefix_length(distance <= self.rollback_threshold)  # [B]
        return make_verdict(x, n, choose(gather_at(target_logits, n), params, generator))
