"""A negligible-cost n-gram drafter (Leviathan section 4.2's unigram/bigram M_q) with real probabilities,
so it drafts under sampling as well as greedy. Backs off to shorter contexts ("stupid backoff" order)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from safetensors.torch import save_file

from ..backends.base import LMBackend
from ..errors import DraftVerifyError
from ..sampling import draw_next, probs_from_logits
from ..types import DecodingState, Draft
from .base import Drafter, stack_draft


def key_bits(vocab_size: int) -> int:
    """Bits per token when a context is packed into one int64 key."""
    return max(1, int(vocab_size - 1).bit_length())


def pack_contexts(contexts: np.ndarray, bits: int) -> np.ndarray:
    """contexts [M, k] -> [M] int64 keys, first token most significant (so keys sort like the tuples)."""
    keys = np.zeros(contexts.shape[0], dtype=np.int64)
    for j in range(contexts.shape[1]):
        keys = (keys << bits) | contexts[:, j].astype(np.int64)
    return keys


@dataclass
class NgramLevel:
    """Every kept context of one length k, sorted by packed key; context m's next tokens are a contiguous run."""

    contexts: np.ndarray  # [M, k] int32
    offsets: np.ndarray  # [M+1] int64: next tokens of context m are tokens[offsets[m]:offsets[m+1]]
    tokens: np.ndarray  # [E] int64
    counts: np.ndarray  # [E] float32
    bits: int  # per token in a packed key
    keys: np.ndarray = None  # [M] int64 sorted packed contexts, derived from contexts

    def __post_init__(self) -> None:
        self.keys = pack_contexts(self.contexts, self.bits)


class NgramTable:
    """Counts of next tokens for every context of length 0..order-1 seen in the data.

    Lookups are a binary search over sorted packed keys per context length, so a table with hundreds of
    thousands of contexts loads in well under a second (no Python object per context).
    """

    def __init__(self, order: int, vocab_size: int, levels: dict[int, NgramLevel]):
        if order < 2:
            raise DraftVerifyError(f"n-gram order must be >= 2 (bigram and up), got {order}")
        if 0 not in levels or levels[0].tokens.size == 0:
            raise DraftVerifyError("the n-gram table is empty: build it from at least one non-empty sequence")
        self.order = order
        self.vocab_size = vocab_size
        self.levels = levels
        unigram = np.ones(vocab_size, dtype=np.float64)  # add-one: every token has a finite score
        np.add.at(unigram, levels[0].tokens, levels[0].counts)
        self.unigram_scores = unigram / unigram.sum()  # [V] backoff_logprobs' floor, the same for every context

    @classmethod
    def from_arrays(cls, order: int, vocab_size: int, arrays: dict[int, tuple]) -> "NgramTable":
        """arrays: k -> (contexts [M, k], offsets [M+1], tokens [E], counts [E]) with contexts sorted."""
        bits = key_bits(vocab_size)
        levels = {
            k: NgramLevel(
                np.asarray(c, dtype=np.int32).reshape(len(o) - 1, k),
                np.asarray(o, dtype=np.int64),
                np.asarray(t, dtype=np.int64),
                np.asarray(n, dtype=np.float32),
                bits,
            )
            for k, (c, o, t, n) in arrays.items()
        }
        for k, level in levels.items():
            if level.keys.size > 1 and not (np.diff(level.keys) > 0).all():
                raise DraftVerifyError(f"n-gram contexts of length {k} are not sorted and unique; rebuild the table")
        return cls(order, vocab_size, levels)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Iterable[int]], order: int, vocab_size: int) -> "NgramTable":
        """Plain counting for small data and tests; `draftverify train ngram` counts large corpora vectorised."""
        if order < 2:
            raise DraftVerifyError(f"n-gram order must be >= 2 (bigram and up), got {order}")
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for seq in sequences:
            seq = list(seq)
            for i, token in enumerate(seq):
                if not (0 <= token < vocab_size):
                    raise DraftVerifyError(f"token id {token} is outside the vocabulary of size {vocab_size}")
                for k in range(0, min(order - 1, i) + 1):
                    counts[tuple(seq[i - k : i])][token] += 1
        arrays = {}
        for k in range(order):
            ctxs = sorted(c for c in counts if len(c) == k)
            if not ctxs:
                continue
            runs = [sorted(counts[c].items()) for c in ctxs]
            offsets = np.cumsum([0] + [len(r) for r in runs])
            arrays[k] = (
                np.array(ctxs, dtype=np.int32).reshape(len(ctxs), k),
                offsets,
                [t for r in runs for t, _ in r],
                [n for r in runs for _, n in r],
            )
        if 0 not in arrays:
            raise DraftVerifyError("the n-gram table is empty: build it from at least one non-empty sequence")
        return cls.from_arrays(order, vocab_size, arrays)

    def next_counts(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [K], counts [K]) for the longest suffix of context that was seen."""
        for k in range(min(self.order - 1, len(context)), -1, -1):
            level = self.levels.get(k)
            if level is None:
                continue
            key = 0
            for token in context[len(context) - k :]:
                key = (key << level.bits) | token
            m = int(np.searchsorted(level.keys, key))
            if m < level.keys.size and level.keys[m] == key:
                lo, hi = level.offsets[m], level.offsets[m + 1]
                return torch.from_numpy(level.tokens[lo:hi]), torch.from_numpy(level.counts[lo:hi])
        raise AssertionError("unreachable: the empty context is always present")

    def backoff_logprobs(self, context: list[int], tokens: list[int] | None = None, backoff: float = 0.4) -> np.ndarray:
        """log S(w | context) for every w [V], or for the ids in `tokens` [n] only: "stupid backoff" scores (Brants
        et al. 2007) over the kept contexts, from an add-one unigram up to the longest seen suffix, so every token
        has a finite score (lattice rescoring must be able to rank any path). Scores, not normalised
        probabilities, as in that scheme. Asking for a few tokens costs a binary search per kept context length,
        not a pass over the vocabulary: a lattice asks this for each of its states."""
        ids = np.arange(self.vocab_size) if tokens is None else np.asarray(tokens, dtype=np.int64)
        scores = self.unigram_scores[ids]
        for k in range(1, min(self.order - 1, len(context)) + 1):
            level = self.levels.get(k)
            key = 0
            for token in context[len(context) - k :]:
                key = (key << self.levels[0].bits) | token
            m = int(np.searchsorted(level.keys, key)) if level is not None else 0
            if level is None or m >= level.keys.size or level.keys[m] != key:
                continue  # unseen (or pruned) context: keep the shorter one's scores
            lo, hi = level.offsets[m], level.offsets[m + 1]
            order = np.argsort(level.tokens[lo:hi])  # a run is by count (train ngram) or by id (from_sequences)
            run, counts = level.tokens[lo:hi][order], level.counts[lo:hi][order].astype(np.float64)
            at = np.minimum(np.searchsorted(run, ids), run.size - 1)
            seen = np.where(run[at] == ids, counts[at], 0.0)
            scores = np.where(seen > 0, seen / counts.sum(), backoff * scores)
        return np.log(scores)

    @property
    def tables(self) -> dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]]:
        """Every context as a dict (for inspection and tests; builds one entry per context)."""
        out = {}
        for level in self.levels.values():
            for m, ctx in enumerate(level.contexts.tolist()):
                lo, hi = level.offsets[m], level.offsets[m + 1]
                out[tuple(ctx)] = (torch.from_numpy(level.tokens[lo:hi]), torch.from_numpy(level.counts[lo:hi]))
        return out

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> int:
        """safetensors with one (contexts, offsets, tokens, counts) group per context length; returns bytes."""
        tensors: dict[str, torch.Tensor] = {}
        for k, level in self.levels.items():
            tensors[f"ctx{k}"] = torch.from_numpy(np.ascontiguousarray(level.contexts, dtype=np.int32))
            tensors[f"offsets{k}"] = torch.from_numpy(np.ascontiguousarray(level.offsets, dtype=np.int64))
            tensors[f"tokens{k}"] = torch.from_numpy(np.ascontiguousarray(level.tokens, dtype=np.int32))
            tensors[f"counts{k}"] = torch.from_numpy(np.ascontiguousarray(level.counts, dtype=np.float32))
        meta = {**(metadata or {}), "order": str(self.order), "vocab_size": str(self.vocab_size)}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)
        return path.stat().st_size

    @classmethod
    def load(cls, path: str | Path) -> "NgramTable":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise DraftVerifyError(f"n-gram table {path} not found; build one with `draftverify train ngram`")
        try:
            with safe_open(str(path), "np") as f:
                meta = f.metadata() or {}
                arrays = {
                    int(key[3:]): (
                        f.get_tensor(key),
                        f.get_tensor(f"offsets{key[3:]}"),
                        f.get_tensor(f"tokens{key[3:]}"),
                        f.get_tensor(f"counts{key[3:]}"),
                    )
                    for key in f.keys()
                    if key.startswith("ctx")
                }
            order, vocab_size = int(meta["order"]), int(meta["vocab_size"])
        except DraftVerifyError:
            raise
        except Exception as err:  # safetensors' own error type, KeyError, ValueError: all mean "not a table"
            raise DraftVerifyError(
                f"{path} is not an n-gram table ({type(err).__name__}: {err}); pass a file written by "
                "`draftverify train ngram` (e.g. zoo/code/ngram.safetensors)"
            ) from None
        return cls.from_arrays(order, vocab_size, arrays)


class NgramDrafter(Drafter):
    """Drafts from an NgramTable; q is the table's next-token distribution after the target's sampling filters."""

    supports_batch = True
    computes_in_torch = False

    def __init__(self, table: NgramTable):
        super().__init__()
        self.table = table

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "NgramDrafter":
        if options.ngram_path is None:
            raise DraftVerifyError("the 'ngram' drafter needs a table: pass ngram_path=... (CLI: --ngram PATH)")
        return cls(NgramTable.load(options.ngram_path))

    def bind(self, target: LMBackend, max_positions: int) -> None:
        if self.table.vocab_size != target.vocab_size:
            raise DraftVerifyError(
                f"the n-gram table was built for a vocabulary of {self.table.vocab_size} tokens but the target has "
                f"{target.vocab_size}; rebuild it with the target's tokenizer"
            )

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        keep = self.table.order - 1
        contexts = [state.row_ids(b)[-keep:] for b in range(state.batch_size)]
        tokens: list[torch.Tensor] = []
        q: list[torch.Tensor] = []
        for i in range(gamma):
            dense = torch.zeros(len(contexts), self.table.vocab_size)
            for b, context in enumerate(contexts):
                ids, counts = self.table.next_counts(context)
                dense[b, ids] = counts
            q_i = probs_from_logits(dense.log(), state.params).to(state.tokens.device)  # [B, V]
            x = draw_next(q_i, state, i)  # [B]
            tokens.append(x)
            q.append(q_i)
            contexts = [(c + [t])[-keep:] for c, t in zip(contexts, x.tolist())]
        return stack_draft(tokens, q, state)
