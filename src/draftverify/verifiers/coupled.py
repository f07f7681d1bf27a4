"""Gumbel-max coupled verification: keep a draft token iff it equals the target's own position-keyed draw.

At decoder position t the target's token is argmax(log p_t + G_t), G_t Gumbel noise that is a pure function of
(seed, t) (sampling.gumbel_noise): an exact sample from p_t, independent across positions. Drafters that see
coupled SamplingParams draw argmax(log q_t + G_t) with the same G_t, so they agree with the target whenever
their q is close to p (acceptance sum_x 1 / sum_y max(p_y/p_x, q_y/q_x), theory.gumbel_acceptance_rate,
at most sum min(p, q) of speculative sampling). What is emitted is always the target's draw, so a seeded text
is identical for every drafter and every draft length, and distributed exactly as the target's samples.
At temperature 0 the noise is dropped and the rule is greedy verification. A token tree is verified the same
way: node j at depth d is kept iff its token is the target's draw at position t + d - 1 after its parent, i.e.
tree greedy verification of the noise-perturbed argmax, so trees stay exact and seed-stable too.
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..registry import register_verifier
from ..sampling import argmax, gumbel_argmax, gumbel_noise, probs_from_logits, row_seeds
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier, accepted_prefix_length, gather_at, make_verdict, within_draft
from .tree import tree_greedy


@register_verifier("gumbel_coupling")
class GumbelCouplingVerifier(Verifier):
    supports_batch = True
    lossless = True
    accepts_trees = True

    def check_params(self, params: SamplingParams) -> None:
        if not params.greedy and params.coupling is False:
            raise DraftVerifyError(
                "the gumbel_coupling verifier samples with position-keyed noise, but coupling=False was asked for; "
                "drop coupling=False or use the speculative_sampling verifier"
            )

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        if params.greedy:
            choice = argmax(target_logits)  # [B, N+1]
        else:
            if draft.position is None:
                raise DraftVerifyError(
                    "gumbel_coupling needs draft.position (the decoder index of the first draft "
                    "token); generate() sets it"
                )
            p = probs_from_logits(target_logits, params)  # [B, N+1, V]
            offsets = torch.arange(p.shape[1], device=p.device)  # chain: verify row i predicts position t + i
            if draft.tree is not None:
                offsets = torch.cat([offsets[:1], draft.tree.depth.to(p.device)])  # row 1+j follows node j's depth
            positions = torch.as_tensor(draft.position).reshape(-1).expand(p.shape[0]).tolist()  # [B]
            seeds = row_seeds(draft.seeds, generator, p.shape[0])  # each row's own seed and position
            noise = torch.stack(
                [
                    gumbel_noise(seed, pos, int(offsets.max()) + 1, p.shape[-1], p.device)
                    for seed, pos in zip(seeds, positions)
                ]
            )  # [B, N+1, V]
            choice = gumbel_argmax(p, noise[:, offsets])  # [B, N+1]: the target's own draws
        if draft.tree is not None:
            return tree_greedy(draft.tokens, draft.tree, choice, draft.valid)
        n = accepted_prefix_length(within_draft(draft, draft.tokens == choice[:, : draft.length]))  # [B]
        return make_verdict(draft.tokens, n, gather_at(choice, n))
