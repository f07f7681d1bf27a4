"""Lossless speculative sampling over a token tree (multi-draft speculative sampling, SpecInfer-style).

A tree of draft tokens is verified top-down. At the current node u (the root is the pending token) the target's
distribution p_res starts as p after u; its children c_1..c_k are tried in index order:

- accept c_i with probability min(1, p_res(x_i) / q_i(x_i)) (r * q_i(x_i) < p_res(x_i), r ~ U(0, 1), as in the
  chain verifier), then move to c_i with p_res = p after c_i and repeat;
- on rejection p_res <- norm(max(p_res - q_i, 0)) and try the next sibling;
- when every child is rejected, or u is a leaf, draw the final token from p_res.

Exactness (Miao et al. 2024, SpecInfer, Theorem 4.2; Chen et al. 2024 "multi-draft speculative sampling"):
each sibling is one step of Leviathan's rejection sampler whose *target* is the current residual. If x_i ~ q_i
independently of the earlier siblings, that step emits a token distributed as p_res overall, so by induction
over siblings the node emits p(. | u) whatever happens; the subtree under an accepted child is then verified
against p after that child. So siblings must be independent draws given their parent (i.i.d. from one q, or
from per-sibling q's); tokens deeper in the tree may depend on their ancestors in any way.

Deterministic candidates (q_probs None: top-k children, prompt-lookup matches) are the special case q_i = one-hot
at x_i: accept with probability p_res(x_i), else p_res(x_i) := 0 and renormalise. Candidates should be distinct
among siblings; a repeated one is harmless (its residual mass is already 0, so it is never accepted twice).

The residual is empty (all zeros) only when p_res <= q_i everywhere, i.e. p_res == q_i, and then every x_i ~ q_i
is accepted (p_res(x)/q_i(x) = 1): a rejection there has probability zero and only float rounding can reach it.
`sampling.residual` then keeps p_res, which is the target's own distribution at that point, so the fallback
never emits a token the target could not.

Vectorised over the batch (every row walks its own path); one Python iteration per tree node (the tree is small
and shared by the batch), no host sync inside the loop, no loop over the vocabulary. Because parents precede
children, one pass over nodes in index order visits every row's siblings in order and reaches a node's children
only after the node itself.
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..sampling import residual, sample
from .base import make_verdict


def tree_speculative_sample(
    parents: torch.Tensor,
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a token tree by recursive rejection over siblings; exact for the target's p.

    parents: [N] long, parents[j] < j, -1 = child of the root (the pending token).
    draft_tokens: [B, N] long, the token of each node.
    q_probs: [B, N, V] the distribution each node's token was drawn from, or None (deterministic candidates).
    p_probs: [B, N+1, V] target probabilities (already filtered); [:, 0] at the root, [:, 1+j] after node j.
    generator: seeded RNG; draws one uniform per (row, node), then one multinomial draw per row.
    valid: [B, N] bool, the nodes each row proposes (None: all); a node a row lacks is no candidate there.

    Returns path [B, N] (accepted node indices root-to-leaf, -1 padded), tokens [B, N+1] (the accepted nodes'
    tokens, then the final token, then -1) and num_accepted [B].
    """
    batch, n = _check(parents, draft_tokens, q_probs, p_probs)
    uniforms = torch.rand((batch, n), generator=generator, device=draft_tokens.device)  # [B, N]
    path, num_accepted, p_next = tree_accept(parents, draft_tokens, q_probs, p_probs, uniforms, valid)
    final = sample(p_next, generator)  # [B]
    path_tokens = draft_tokens.gather(1, path.clamp_min(0))  # [B, N]; entries past num_accepted are masked below
    tokens = make_verdict(path_tokens, num_accepted, final).tokens  # [B, N+1]
    return path, tokens, num_accepted


def tree_accept(
    parents: torch.Tensor,
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor | None,
    p_probs: torch.Tensor,
    uniforms: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The acceptance walk with given uniforms [B, N] (uniforms[:, j] decides node j; valid [B, N]: the nodes
    each row proposes, None = all).

    Returns path [B, N] (-1 padded), num_accepted [B] and p_next [B, V], the distribution of the final token:
    p after the last accepted node (the root if none) with all of that node's rejected children taken out by the
    residual updates; p itself at a leaf.
    """
    batch, n = draft_tokens.shape
    dtype = torch.promote_types(p_probs.dtype, torch.float32 if q_probs is None else q_probs.dtype)
    dtype = torch.promote_types(dtype, torch.float32)  # half inputs are upcast
    p = p_probs.to(dtype)  # [B, N+1, V]
    q = None if q_probs is None else q_probs.to(dtype)  # [B, N, V]
    parents = parents.to(draft_tokens.device)
    rows = torch.arange(batch, device=draft_tokens.device)

    current = torch.full((batch,), -1, dtype=torch.long, device=draft_tokens.device)  # [B] node we stand on
    depth = torch.zeros(batch, dtype=torch.long, device=draft_tokens.device)  # [B] = num_accepted so far
    path = torch.full((batch, n + 1), -1, dtype=torch.long, device=draft_tokens.device)  # extra column = scratch
    p_res = p[:, 0].clone()  # [B, V]
    for j in range(n):
        x = draft_tokens[:, j : j + 1]  # [B, 1]
        if q is None:
            q_j = torch.zeros_like(p_res).scatter_(-1, x, 1.0)  # [B, V] one-hot at x
        else:
            q_j = q[:, j]  # [B, V]
        trying = current == parents[j]  # [B] rows standing on j's parent and still trying its children
        if valid is not None:
            trying &= valid[:, j].to(trying.device)
        p_x = p_res.gather(-1, x).squeeze(-1)  # [B]
        q_x = q_j.gather(-1, x).squeeze(-1)  # [B]
        accept = trying & (uniforms[:, j] * q_x < p_x)  # [B]
        reject = trying & ~accept
        p_res = torch.where(reject[:, None], residual(p_res, q_j), p_res)
        p_res = torch.where(accept[:, None], p[:, 1 + j], p_res)
        # write j at position depth for accepted rows; other rows write to the scratch column N
        path[rows, torch.where(accept, depth, n)] = j
        depth = depth + accept.long()
        current = torch.where(accept, j, current)
    return path[:, :n], depth, p_res


def _check(parents, draft_tokens, q_probs, p_probs) -> tuple[int, int]:
    """Shapes always; the topological order only when parents is on the CPU (no device sync)."""
    if draft_tokens.dim() != 2:
        raise DraftVerifyError(f"draft_tokens must be [B, N], got shape {tuple(draft_tokens.shape)}")
    batch, n = draft_tokens.shape
    if parents.shape != (n,):
        raise DraftVerifyError(f"parents must be [N] = [{n}], got shape {tuple(parents.shape)}")
    if p_probs.dim() != 3 or p_probs.shape[:2] != (batch, n + 1):
        raise DraftVerifyError(f"p_probs must be [B, N+1, V] = [{batch}, {n + 1}, V], got {tuple(p_probs.shape)}")
    if q_probs is not None and q_probs.shape != (batch, n, p_probs.shape[-1]):
        raise DraftVerifyError(
            f"q_probs must be [B, N, V] = [{batch}, {n}, {p_probs.shape[-1]}] or None, got {tuple(q_probs.shape)}"
        )
    if parents.device.type == "cpu" and n > 0:
        if not bool(((parents >= -1) & (parents < torch.arange(n))).all()):
            raise DraftVerifyError(
                f"parents must list each node's parent before it (-1 <= parents[j] < j), got {parents.tolist()}"
            )
    return batch, n
