"""Greedy verification: keep the longest prefix equal to the target's argmax, then the target's own token."""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..registry import register_verifier
from ..sampling import argmax, argmax_lists, host_array
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, accepted_prefix_length, gather_at, greedy_chain_verdict, make_verdict, within_draft


@register_verifier("greedy")
class GreedyVerifier(Verifier):
    supports_batch = True
    lossless = True

    def check_params(self, params: SamplingParams) -> None:
        if not params.greedy:
            raise DraftVerifyError(
                f"the greedy verifier needs temperature 0 (got {params.temperature}); "
                "use speculative_sampling to sample exactly from the target"
            )

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        host = host_array(target_logits)
        if host is not None:  # a host backend's view: one NumPy argmax, the rest on ints
            return greedy_chain_verdict(draft, host.argmax(axis=-1).tolist())
        if target_logits.is_cpu:
            return greedy_chain_verdict(draft, argmax_lists(target_logits))
        choice = argmax(target_logits)  # [B, N+1]
        n = accepted_prefix_length(within_draft(draft, draft.tokens == choice[:, : draft.length]))  # [B]
        return make_verdict(draft.tokens, n, gather_at(choice, n))
