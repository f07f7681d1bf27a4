"""Speculative sampling (Leviathan et al. Algorithm 1), exact for any temperature / top-k / top-p.

Accept draft token x_i when r_i < p_i(x_i) / (l * q_i(x_i)), r_i ~ U(0, 1); at the first rejection draw from
norm(max(0, p - l*q)); if all are accepted draw the bonus token from p_{N+1}. l = 1 is exact; l < 1 is the
lenient variant of Appendix A.5 (no token is sampled with probability above p(x)/l).
At temperature 0 the rule is the A.5 argmax lenience: accept x when p(x) >= l * max p (l = 1: plain greedy).
"""

from __future__ import annotations

import torch

from ..errors import check_number
from ..registry import register_verifier
from ..sampling import argmax, probs_from_logits, residual, sample
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, accepted_prefix_length, gather_at, make_verdict, within_draft


@register_verifier("speculative_sampling")
class SpeculativeSamplingVerifier(Verifier):
    supports_batch = True

    def __init__(self, lenience: float = 1.0):
        self.lenience = check_number("lenience l", lenience, 0.0, 1.0, low_open=True)
        self.lossless = lenience == 1.0

    @classmethod
    def from_options(cls, options) -> "SpeculativeSamplingVerifier":
        return cls(lenience=options.lenience)

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        if params.greedy:
            return self._verify_argmax(draft, target_logits)
        return self._verify_sampled(draft, target_logits, params, generator)

    def _verify_argmax(self, draft: Draft, target_logits: torch.Tensor) -> Verdict:
        x = draft.tokens  # [B, N]
        choice = argmax(target_logits)  # [B, N+1]
        if self.lenience == 1.0:
            accept = x == choice[:, : draft.length]
        else:
            p = target_logits[:, : draft.length].float().softmax(dim=-1)  # [B, N, V]
            p_x = p.gather(-1, x[..., None]).squeeze(-1)  # [B, N]
            accept = p_x >= self.lenience * p.amax(dim=-1)
        n = accepted_prefix_length(within_draft(draft, accept))
        return make_verdict(x, n, gather_at(choice, n))

    def _verify_sampled(self, draft: Draft, target_logits, params: SamplingParams, generator) -> Verdict:
        x = draft.tokens  # [B, N]
        batch, length = x.shape
        p = probs_from_logits(target_logits, params)  # [B, N+1, V]
        if draft.q_probs is None:  # deterministic proposal: q is one-hot at x
            q = torch.zeros_like(p[:, :length]).scatter_(-1, x[..., None], 1.0)  # [B, N, V]
        else:
            q = draft.q_probs.float()
        lq = self.lenience * q
        if draft.lengths is not None:  # positions past a row's draft propose nothing: q = 0 there
            lq = lq * (torch.arange(length, device=x.device)[None] < draft.lengths.to(x.device)[:, None])[..., None]
        p_x = p[:, :length].gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        lq_x = lq.gather(-1, x[..., None]).squeeze(-1)  # [B, N]
        r = torch.rand((batch, length), generator=generator, device=x.device)  # [B, N]
        n = accepted_prefix_length(within_draft(draft, r * lq_x < p_x))  # [B]
        # next-token distribution: residual at the first rejection, p itself for the bonus token
        lq_padded = torch.cat([lq, torch.zeros_like(p[:, :1])], dim=1)  # [B, N+1, V]
        p_next = residual(gather_at(p, n), gather_at(lq_padded, n))  # [B, V]
        return make_verdict(x, n, sample(p_next, generator))
