"""Verification of token trees (Medusa's evaluate_posterior; SpecInfer's multi-draft speculative sampling).

target_logits [B, N+1, V] come from one forward over the pending token (index 0) and the N tree nodes
(index 1 + j scores the token after node j, seeing only node j's ancestors).
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..registry import register_verifier
from ..sampling import argmax, probs_from_logits
from ..tree import TreeSpec
from ..types import Draft, SamplingParams, Verdict
from .base import Verifier
from .tree_sampling import tree_speculative_sample


def tree_verdict(
    tokens: torch.Tensor, branch: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> Verdict:
    """tokens [B, N] node tokens, branch [B, D] root-to-leaf node indices (-1 padded, first num_accepted kept),
    num_accepted [B], next_token [B] -> Verdict(tokens [B, N+1], num_accepted, path [B, N])."""
    batch, n = tokens.shape
    depth = torch.arange(branch.shape[1], device=tokens.device)[None]  # [1, D]
    kept = torch.where(depth < num_accepted[:, None], branch, torch.full_like(branch, -1))  # [B, D]
    path = torch.cat([kept, kept.new_full((batch, n - kept.shape[1]), -1)], dim=1)  # [B, N]
    emitted = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), torch.full_like(path, -1))  # [B, N]
    out = torch.cat([emitted, emitted.new_full((batch, 1), -1)], dim=1)  # [B, N+1]
    out.scatter_(1, num_accepted[:, None], next_token[:, None])
    return Verdict(tokens=out, num_accepted=num_accepted, path=path)


def tree_greedy(
    tokens: torch.Tensor, tree: TreeSpec, choice: torch.Tensor, valid: torch.Tensor | None = None
) -> Verdict:
    """Longest root-to-leaf branch whose every token equals the target's argmax at its parent, then the target's
    argmax after the branch. tokens [B, N], choice [B, N+1] (argmax at the pending token, then after each node).

    All leaves are scored at once through retrieve_indices; no loop over nodes, no host sync.
    """
    retrieve = tree.retrieve_indices.to(tokens.device)  # [P, D]
    parent_choice = choice[:, tree.parents.to(tokens.device) + 1]  # [B, N] target's token where each node hangs
    match = tokens == parent_choice  # [B, N]
    if valid is not None:  # a node a row does not propose (row_trees) is never kept
        match &= valid.to(match.device)
    on_branch = match[:, retrieve.clamp(min=0)] & (retrieve >= 0)  # [B, P, D]
    accepted = on_branch.long().cumprod(dim=-1).sum(dim=-1)  # [B, P]
    num_accepted, best = accepted.max(dim=-1)  # [B], [B]
    branch = retrieve[best]  # [B, D]
    last = branch.gather(1, (num_accepted - 1).clamp(min=0)[:, None]).squeeze(1)  # [B] deepest kept node
    last = torch.where(num_accepted > 0, last, torch.full_like(last, -1))  # -1 = the root (pending token)
    next_token = choice.gather(1, (last + 1)[:, None]).squeeze(1)  # [B]
    return tree_verdict(tokens, branch, num_accepted, next_token)


def _need_tree(draft: Draft, name: str) -> TreeSpec:
    if draft.tree is None:
        raise DraftVerifyError(f"the {name} verifier needs a tree draft; chains use greedy / speculative_sampling")
    return draft.tree


@register_verifier("tree_greedy")
class TreeGreedyVerifier(Verifier):
    lossless = True
    accepts_trees = True

    def check_params(self, params: SamplingParams) -> None:
        if not params.greedy:
            raise DraftVerifyError(
                f"tree_greedy needs temperature 0 (got {params.temperature}); use tree_speculative_sampling"
            )

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        return tree_greedy(draft.tokens, _need_tree(draft, self.name), argmax(target_logits), draft.valid)


@register_verifier("tree_speculative_sampling")
class TreeSpeculativeSamplingVerifier(Verifier):
    """Lossless at any temperature: recursive rejection over each node's children (SpecInfer / multi-draft
    speculative sampling), delegated to tree_sampling.tree_speculative_sample."""

    lossless = True
    accepts_trees = True

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        tree = _need_tree(draft, self.name)
        p = probs_from_logits(target_logits, params)  # [B, N+1, V]
        path, tokens, num_accepted = tree_speculative_sample(
            tree.parents.to(p.device), draft.tokens, draft.q_probs, p, generator, draft.valid
        )
        return Verdict(tokens=tokens, num_accepted=num_accepted, path=path)
