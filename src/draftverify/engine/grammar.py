"""Structured output as a logits processor: each constrained row's grammar matcher (xgrammar, structured.py) walks
the step's draft, a chain or a tree, filling the token bitmask of every verify position (xgrammar's
traverse_draft_tree: the matcher itself is left where it was); the bitmask forbids the rest at each position, a draft
token outside its parent position's bitmask is cut before the target scores it (Processors.cut), and the matcher
advances by what each step emits (commit): what the verdict rejects it never took."""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError
from ..structured import require_xgrammar
from ..types import DecodingState
from .processor import Mask, RowStart, Step, kept_rows


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A token bitmask [..., W] int32 (bit t % 32 of word t // 32) as allowed [..., vocab_size] bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[..., None] >> shifts) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()


def pack(tokens: list[int], words: int) -> torch.Tensor:
    """The bitmask row [W] int32 that allows exactly `tokens`."""
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[tokens] = 1
    value = (bits.view(words, 32) << torch.arange(32)).sum(dim=-1)  # [W] as unsigned 32-bit words
    return torch.where(value >= 2**31, value - 2**32, value).to(torch.int32)


def layout(parents: list[int], limit: int, valid: list[bool] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's draft as xgrammar walks it: node 0 the pending token, node 1+j draft node j; each node's first child
    and next sibling ([1+N] each, -1: none), over the nodes the row proposes (its first `limit`, those `valid`)."""
    n = len(parents)
    first_child, next_sibling = [-1] * (1 + n), [-1] * (1 + n)
    last: dict[int, int] = {}
    kept = [True] + [False] * n
    for j, parent in enumerate(parents):
        node, above = j + 1, parent + 1
        if j >= limit or (valid is not None and not valid[j]) or not kept[above]:
            continue
        kept[node] = True
        if above in last:
            next_sibling[last[above]] = node
        else:
            first_child[above] = node
        last[above] = node
    return torch.tensor(first_child), torch.tensor(next_sibling)


class GrammarMask(Mask):
    """Each row's compiled grammar (processing.Structured, compiled by structured.GrammarCompiler) as a mask."""

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__(vocab_size, device)
        self.words = (vocab_size + 31) // 32
        self.matchers: list = []  # per row: its matcher, or None
        self.ends: list[torch.Tensor] = []  # per row: the bitmask row of its stop tokens [W] (a complete grammar's)
        self.bitmask = torch.empty(0, 1, self.words, dtype=torch.int32, device=device)  # this step's [B, 1+N, W]

    @staticmethod
    def needed(row: RowStart) -> bool:
        return row.processing.structured is not None

    @property
    def active(self) -> bool:
        return any(m is not None for m in self.matchers)

    def add(self, rows: list[RowStart]) -> None:
        for row in rows:
            grammar = row.processing.structured
            self.matchers.append(None if grammar is None else grammar.matcher())
            self.ends.append(pack([] if grammar is None else list(grammar.stop_ids), self.words))

    def drop(self, keep: list[bool]) -> None:
        self.matchers, self.ends = kept_rows(self.matchers, keep), kept_rows(self.ends, keep)

    def prepare(self, state: DecodingState, step: Step) -> None:
        draft = step.draft
        n = draft.length
        bitmask = torch.full((len(self.matchers), 1 + n, self.words), -1, dtype=torch.int32)  # all allowed
        pending = state.last_tokens()
        tokens = draft.rows if n else [[] for _ in self.matchers]
        limits = draft.lengths.tolist() if draft.lengths is not None else [n] * len(self.matchers)
        valid = draft.valid.tolist() if draft.valid is not None else None
        for b, matcher in enumerate(self.matchers):
            if matcher is None:
                continue
            if matcher.is_terminated():  # complete, its stop token out: only stop tokens follow (ignore_eos goes on)
                bitmask[b] = self.ends[b]
                continue
            first_child, next_sibling = layout(step.parents, limits[b], None if valid is None else valid[b])
            matcher.traverse_draft_tree(first_child, next_sibling, torch.tensor([pending[b], *tokens[b]]), bitmask[b])
            # nothing allowed: a node the grammar refused (never kept), or a grammar that admits no more text
            empty = (bitmask[b] == 0).all(dim=-1)
            bitmask[b, empty] = self.ends[b]
        self.bitmask = bitmask.to(self.device)

    def allows(self, step: Step) -> torch.Tensor:
        tokens = step.draft.tokens.to(self.bitmask.device)  # [B, N]
        rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
        words = self.bitmask[rows, step.node_position.to(tokens.device)[None], tokens >> 5]  # [B, N]
        return ((words >> (tokens & 31)) & 1).bool()

    def forbid(self, values: torch.Tensor, step: Step, positions: torch.Tensor) -> torch.Tensor:
        masks = self.bitmask[:, positions.to(self.bitmask.device)]  # [B, P, W]
        vocab = values.shape[-1]
        if values.is_cpu and values.dtype == torch.float32 and values.is_contiguous():  # xgrammar's CPU kernel
            require_xgrammar().apply_token_bitmask_inplace(
                values.view(-1, vocab), masks.reshape(-1, self.words).contiguous(), vocab_size=vocab
            )
            return values
        return values.masked_fill_(~unpack(masks, vocab).to(values.device), float("-inf"))

    def commit(self, emitted: list[list[int]]) -> None:
        for matcher, tokens in zip(self.matchers, emitted):
            if matcher is None:
                continue
            for token in tokens:
                if matcher.is_terminated():
                    break
                if not matcher.accept_token(token):
                    raise DraftVerifyError(f"token {token} was emitted against its row's grammar (a processor bug)")
