"""A negligible-cost n-gram drafter (Leviathan section 4.2's unigram/bigram M_q) with real probabilities,
so it drafts under sampling as well as greedy. Backs off to shorter contexts ("stupid backoff" order)."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file, save_file

from ..cached_lm import CachedLM
from ..errors import DraftVerifyError
from ..registry import register_drafter
from ..sampling import probs_from_logits, sample
from ..types import DecodingState, Draft
from .base import Drafter, stack_draft


class NgramTable:
    """Counts of next tokens for every context of length 0..order-1 seen in the data."""

    def __init__(self, order: int, vocab_size: int, tables: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]]):
        if order < 2:
            raise DraftVerifyError(f"n-gram order must be >= 2 (bigram and up), got {order}")
        if () not in tables:
            raise DraftVerifyError("the n-gram table is empty: build it from at least one non-empty sequence")
        self.order = order
        self.vocab_size = vocab_size
        self.tables = tables  # context tuple -> (next tokens [K] long, counts [K] float)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Iterable[int]], order: int, vocab_size: int) -> "NgramTable":
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for seq in sequences:
            seq = list(seq)
            for i, token in enumerate(seq):
                if not (0 <= token < vocab_size):
                    raise DraftVerifyError(f"token id {token} is outside the vocabulary of size {vocab_size}")
                for k in range(0, min(order - 1, i) + 1):
                    counts[tuple(seq[i - k : i])][token] += 1
        tables = {
            ctx: (torch.tensor(list(c.keys()), dtype=torch.long), torch.tensor(list(c.values()), dtype=torch.float32))
            for ctx, c in counts.items()
        }
        return cls(order, vocab_size, tables)

    def next_counts(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [K], counts [K]) for the longest suffix of context that was seen."""
        for k in range(min(self.order - 1, len(context)), -1, -1):
            hit = self.tables.get(tuple(context[len(context) - k :]))
            if hit is not None:
                return hit
        raise AssertionError("unreachable: the empty context is always present")

    def save(self, path: str | Path) -> None:
        """safetensors with one (contexts, offsets, tokens, counts) group per context length."""
        tensors: dict[str, torch.Tensor] = {}
        by_len: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for ctx in self.tables:
            by_len[len(ctx)].append(ctx)
        for k, ctxs in by_len.items():
            tokens = [self.tables[c][0] for c in ctxs]
            tensors[f"ctx{k}"] = torch.tensor(ctxs, dtype=torch.int32).reshape(len(ctxs), k)
            tensors[f"offsets{k}"] = torch.tensor([0] + [len(t) for t in tokens], dtype=torch.int64).cumsum(0)
            tensors[f"tokens{k}"] = torch.cat(tokens).to(torch.int32)
            tensors[f"counts{k}"] = torch.cat([self.tables[c][1] for c in ctxs])
        save_file(tensors, str(path), metadata={"order": str(self.order), "vocab_size": str(self.vocab_size)})

    @classmethod
    def load(cls, path: str | Path) -> "NgramTable":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise DraftVerifyError(f"n-gram table {path} not found; build one with `draftverify train ngram`")
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        tensors = load_file(str(path))
        tables = {}
        for key in tensors:
            if not key.startswith("ctx"):
                continue
            k = int(key[3:])
            ctxs, offsets = tensors[key].tolist(), tensors[f"offsets{k}"].tolist()
            tokens, counts = tensors[f"tokens{k}"].long(), tensors[f"counts{k}"]
            for i, ctx in enumerate(ctxs):
                tables[tuple(ctx)] = (tokens[offsets[i] : offsets[i + 1]], counts[offsets[i] : offsets[i + 1]])
        return cls(int(meta["order"]), int(meta["vocab_size"]), tables)


@register_drafter("ngram")
class NgramDrafter(Drafter):
    """Drafts from an NgramTable; q is the table's next-token distribution after the target's sampling filters."""

    def __init__(self, table: NgramTable):
        super().__init__()
        self.table = table

    @classmethod
    def from_options(cls, target: CachedLM, options) -> "NgramDrafter":
        if options.ngram_path is None:
            raise DraftVerifyError("the 'ngram' drafter needs a table: pass ngram_path=... (CLI: --ngram PATH)")
        return cls(NgramTable.load(options.ngram_path))

    def bind(self, target: CachedLM, max_positions: int) -> None:
        if self.table.vocab_size != target.vocab_size:
            raise DraftVerifyError(
                f"the n-gram table was built for a vocabulary of {self.table.vocab_size} tokens but the target has "
                f"{target.vocab_size}; rebuild it with the target's tokenizer"
            )

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if state.tokens.shape[0] != 1:
            raise DraftVerifyError("the n-gram drafter drafts one sequence at a time (batch size 1)")
        context = state.tokens[0, -(self.table.order - 1) :].tolist()
        tokens: list[torch.Tensor] = []
        q: list[torch.Tensor] = []
        for _ in range(gamma):
            ids, counts = self.table.next_counts(context)
            dense = torch.zeros(self.table.vocab_size)
            dense[ids] = counts
            q_i = probs_from_logits(dense.log()[None], state.params)  # [1, V]
            x = q_i.argmax(dim=-1) if state.params.greedy else sample(q_i, state.generator)  # [1]
            tokens.append(x)
            q.append(q_i)
            context = (context + [int(x)])[-(self.table.order - 1) :]
        return stack_draft(tokens, q, state)
