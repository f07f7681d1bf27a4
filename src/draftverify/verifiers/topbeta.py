"""SpecDec++ relaxed verification (Xia et al., section 4, eqs. 6 and 7).

A draft token x is kept when it is among the target's top-beta candidates (eq. 6) and its log-likelihood is
within tau of the target's top-1 (eq. 7). Both sides are scored by the verifier (the AT model), as in the
authors' implementation. beta = 1, tau = 0 is exactly greedy verification.
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError, check_number
from ..registry import register_verifier
from ..sampling import choose
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, accepted_prefix_length, gather_at, make_verdict


@register_verifier("topbeta")
class TopBetaVerifier(Verifier):
    def __init__(self, beta: int = 3, tau: float = 1.0):
        if isinstance(beta, bool) or not isinstance(beta, int) or beta < 1:
            raise DraftVerifyError(f"top-beta needs an integer beta >= 1, got {beta!r}")
        self.beta = beta
        self.tau = check_number("tolerance tau", tau, 0.0)
        self.lossless = beta == 1 and tau == 0.0

    @classmethod
    def from_options(cls, options) -> "TopBetaVerifier":
        return cls(beta=options.beta, tau=options.tau)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        x = draft.tokens  # [B, N]
        log_p = target_logits[:, : draft.length].float().log_softmax(dim=-1)  # [B, N, V]
        log_p_x = log_p.gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        top = log_p.topk(min(self.beta, log_p.shape[-1]), dim=-1).values  # [B, N, beta]
        in_top_beta = log_p_x >= top[..., -1]  # eq. 6
        within_tau = top[..., 0] - log_p_x <= self.tau  # eq. 7
        n = accepted_prefix_length(in_top_beta & within_tau)
        return make_verdict(x, n, choose(gather_at(target_logits, n), params, generator))
