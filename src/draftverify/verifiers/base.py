"""The verifier interface and the one helper every rule shares: keep an accepted prefix, append one token."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..types import Draft, SamplingParams, Verdict


class Verifier(ABC):
    name: str = "?"
    lossless: bool = False  # True when the output provably equals (in distribution) the target's own decoding
    accepts_trees: bool = False  # chain rules read position i as "after draft[:, :i]", which a tree breaks
    supports_batch: bool = False  # judges several rows at once, each with its own draft length (Draft.lengths)
    per_row_params: bool = False  # judges rows with different sampling settings at once (sampling.RowParams)

    @classmethod
    def from_options(cls, options) -> "Verifier":
        """Build from a methods.MethodOptions; reads only this verifier's fields."""
        return cls()

    def check_params(self, params: SamplingParams) -> None:
        """Raise DraftVerifyError if this rule cannot serve these sampling settings."""

    @abstractmethod
    def verify(
        self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> Verdict:
        """target_logits: [B, N+1, V]; position i scores the token after draft[:, :i]."""


def accepted_prefix_length(accept: torch.Tensor) -> torch.Tensor:
    """accept: [B, N] bool -> [B] length of the all-True prefix (no host sync)."""
    return accept.long().cumprod(dim=-1).sum(dim=-1)


def within_draft(draft, accept: torch.Tensor) -> torch.Tensor:
    """accept [B, N] with every position past a row's own draft length (draft.lengths, ragged batches) False."""
    if draft.lengths is None:
        return accept
    positions = torch.arange(accept.shape[1], device=accept.device)[None]
    return accept & (positions < draft.lengths.to(accept.device)[:, None])


def make_verdict(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor) -> Verdict:
    """draft_tokens [B, N], num_accepted [B], next_token [B] -> tokens [B, N+1]: prefix, next token, then -1."""
    batch, n = draft_tokens.shape
    positions = torch.arange(n + 1, device=draft_tokens.device)[None]  # [1, N+1]
    padded = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), -1)], dim=1)  # [B, N+1]
    tokens = torch.where(positions < num_accepted[:, None], padded, torch.full_like(padded, -1))
    tokens.scatter_(1, num_accepted[:, None], next_token[:, None])
    nodes = positions[:, :n].expand(batch, n)  # [B, N]
    path = torch.where(nodes < num_accepted[:, None], nodes, torch.full_like(nodes, -1))
    return Verdict(tokens=tokens, num_accepted=num_accepted, path=path)


def greedy_chain_verdict(draft: Draft, choice: list[list[int]]) -> Verdict:
    """A chain judged on the host by the target's greedy choices choice [B][>= N+1] (Python ints): each row keeps
    its drafts up to the first that differs from the choice (within its own length, draft.lengths), then the choice
    after them. Walks lists and makes no tensor: after a llama.cpp forward has streamed the target's weights
    through the caches, each small tensor op pays its dispatch again."""
    drafted = draft.rows
    width = draft.length
    limits = draft.lengths.tolist() if draft.lengths is not None else [width] * len(drafted)
    rows, accepted = [], []
    for mine, theirs, limit in zip(drafted, choice, limits):
        n = 0
        while n < limit and mine[n] == theirs[n]:
            n += 1
        rows.append(mine[:n] + [theirs[n]] + [-1] * (width - n))
        accepted.append(n)
    return Verdict.of_chain(rows, accepted, draft.device)


def gather_at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, M, ...], index [B] -> values[b, index[b]] : [B, ...]."""
    return values[torch.arange(values.shape[0], device=values.device), index]


def rows_of(draft: Draft, rows: torch.Tensor) -> Draft:
    """The draft of some rows (indices [G]): the same tree, each row's tokens, q, length, position and seed."""
    pick = lambda x: None if x is None else x[rows.to(x.device)]  # noqa: E731
    position = (
        draft.position[rows.to(draft.position.device)] if isinstance(draft.position, torch.Tensor) else draft.position
    )
    seeds = None if draft.seeds is None else [draft.seeds[b] for b in rows.tolist()]
    return Draft(
        tokens=draft.tokens[rows.to(draft.tokens.device)],
        q_probs=pick(draft.q_probs),
        tree=draft.tree,
        lengths=pick(draft.lengths),
        valid=pick(draft.valid),
        position=position,
        seeds=seeds,
    )


def verify_by_rows(verify, draft: Draft, target_logits: torch.Tensor, params, generator) -> Verdict:
    """Judge each group of rows that share sampling settings (sampling.RowParams) by verify(draft of the group,
    its logits, its settings, generator), and put the verdicts back in row order."""
    parts = [
        (rows, verify(rows_of(draft, rows), target_logits[rows.to(target_logits.device)], p, generator))
        for p, rows in params.groups()
    ]
    batch = draft.tokens.shape[0]
    first = parts[0][1]
    tokens = first.tokens.new_full((batch, first.tokens.shape[1]), -1)
    num_accepted = first.num_accepted.new_zeros(batch)
    path = first.path.new_full((batch, first.path.shape[1]), -1)
    for rows, verdict in parts:
        index = rows.to(tokens.device)
        tokens[index], num_accepted[index], path[index] = verdict.tokens, verdict.num_accepted, verdict.path
    return Verdict(tokens=tokens, num_accepted=num_accepted, path=path)
