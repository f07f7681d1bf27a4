"""The target backend seam: what the decoding loop and the drafters need of a model that scores tokens.

A backend holds one model and its KV cache for one generation at a time, and owns the positions: `length` is
how many positions its cache holds, `committed` how many of those are settled. The loop's step is

    out = backend.forward(tokens [B, n], position_ids, attention_mask)   # logits [B, n, V] (+ hidden [B, n, H])
    backend.commit_rows(counts [B])                                       # each row's chain prefix, or
    backend.commit(kept [B, k])                                           # a tree's branch

and nothing else of the model is read: no cache object, no config, no modules. `CachedLM` (Hugging Face,
eager or compiled) is one implementation, `LlamaCppLM` (llama.cpp through llama-cpp-python) another; a third
(vLLM's or ONNX Runtime's forward) implements this protocol and plugs in without touching the loop.

What a backend cannot do it declares with capability flags, so a method that needs it is refused at load time
with one line naming a backend that can (`check_backend`), never halfway through a generation:
- `takes_positions`: scores token trees (explicit position ids and an ancestor mask over its uncommitted tail);
- `supports_rows`: decodes batches of several left-padded rows (forward's new_valid, join_rows); one row is a
  batch of one, so every backend answers the row calls (`OneRow` writes them for a one-row backend in terms of
  commit and length);
- `exposes_hidden`: returns the last hidden state (drafters with heads on the target's hidden states);
- `has_modules`: a Hugging Face module tree the drafters may read or extend (early exit, BiTA's adapter and its
  extra embedded positions, blockwise heads on the target's LM head, the NAT drafter over the target's layers).

One optional flag (read with `computes_in_torch`, True where a backend does not declare it): `computes_in_torch`
says whether the forward runs on torch's intra-op threads. When no model of a generation does (llama.cpp), the loop
runs its own small tensor ops on one torch thread (loop.py).

One more (read with `defers_prefill`, False where undeclared): `defers_prefill` says that start() only records the
prompt and the first forward decodes it together with its own tokens (one decode fewer per request); the loop then
counts that first step's time as the prefill's and keeps it out of the length policy's cost model.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..errors import DraftVerifyError
from ..types import TargetOutput


@runtime_checkable
class LMBackend(Protocol):
    """One model and its cache (target or draft). Invariant between steps: the cache holds every committed token
    but the last (the pending token, which the next forward scores first)."""

    name: str  # the backend's name as --backend spells it: "hf", "llamacpp"
    role: str  # "target" or "draft", for messages
    device: torch.device  # where logits come back
    vocab_size: int  # rows of the output logits
    is_encoder_decoder: bool
    max_positions: int | None  # context limit, or None when unbounded
    takes_positions: bool
    supports_rows: bool
    exposes_hidden: bool
    has_modules: bool
    length: int  # positions held in the cache
    committed: int  # settled positions; [committed, length) is the tail of the forwards since the last commit
    prefilled: TargetOutput | None  # set by start(): logits at the last prefilled position (and hidden states)

    def check_fits(self, decoder_positions: int) -> None:
        """Raise DraftVerifyError when a request of this many positions cannot run (context, preallocated cache)."""

    def start(self, input_ids: torch.Tensor, want_hidden: bool = False,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reset and prefill input_ids [B, L] (all but the last token); return the committed tokens [B, L0]."""

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, want_hidden: bool = False,
                new_valid: torch.Tensor | None = None) -> TargetOutput:
        """Append tokens [B, n] to the uncommitted tail; their next-token logits [B, n, V].

        position_ids [B or 1, n]: absolute positions (None: after the tail, as a chain); attention_mask bool
        [n, tail + n] over the tail and the new tokens (None: causal); every committed position is always visible.
        """

    def commit(self, kept: int | torch.Tensor) -> None:
        """Keep the tail's first `kept` positions (a chain), or the tail offsets kept [B, k] / [k] in order (a
        tree's accepted branch), drop the rest of the tail and settle."""

    @property
    def row_length(self) -> torch.Tensor:
        """Positions each row holds [B] (its next position id)."""

    def commit_rows(self, counts: torch.Tensor) -> None:
        """Row b keeps its tail's first counts[b] positions [B] (a chain), drops the rest and settles."""

    def truncate_rows(self, upto: torch.Tensor) -> None:
        """Row b keeps its first upto[b] positions [B] (at least what it committed) and settles."""

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        """Keep the rows where keep_rows [B] (bool) is True, between steps (finished rows leave)."""


def one_row(values, name: str) -> int:
    """The one entry of a one-row backend's per-row values [1], as an int."""
    values = torch.as_tensor(values)
    if values.numel() != 1:
        raise DraftVerifyError(f"{name} has {values.numel()} entries for a backend that holds one row")
    return int(values)


class OneRow:
    """The protocol's row calls for a backend that holds one row, in terms of its commit and length."""

    supports_rows = False

    @property
    def row_length(self) -> torch.Tensor:
        return torch.tensor([self.length], device=self.device)

    def commit_rows(self, counts: torch.Tensor) -> None:
        self.commit(one_row(counts, "counts"))

    def truncate_rows(self, upto: torch.Tensor) -> None:
        self.commit(one_row(upto, "upto") - self.committed)

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        if not bool(torch.as_tensor(keep_rows).all()):
            raise DraftVerifyError(f"the {self.name} backend holds one row; start() the next request instead")


def computes_in_torch(backend: object) -> bool:
    """Whether a backend's forward runs on torch's intra-op threads (its optional flag; True when undeclared)."""
    return bool(getattr(backend, "computes_in_torch", True))


def defers_prefill(backend: object) -> bool:
    """Whether a backend's first forward after start() also decodes the prompt (its optional flag)."""
    return bool(getattr(backend, "defers_prefill", False))


def is_backend(obj: object) -> bool:
    return isinstance(obj, LMBackend)


def check_backend(target: LMBackend, drafter_cls: type, method: str, batched: bool = False) -> None:
    """Refuse, before anything runs, a method whose drafter needs what this target backend lacks."""
    name = getattr(target, "name", type(target).__name__)
    needs = []
    if getattr(drafter_cls, "needs_target_modules", "") and not target.has_modules:
        needs.append(drafter_cls.needs_target_modules)
    elif getattr(drafter_cls, "needs_target_hidden", False) and not target.exposes_hidden:
        needs.append("the target's hidden states")
    if getattr(drafter_cls, "proposes_trees", False) and not target.takes_positions:
        needs.append("token trees (explicit positions and an ancestor mask)")
    if batched and not target.supports_rows:
        needs.append("batches of several rows")
    if needs:
        raise DraftVerifyError(f"method {method!r} needs {' and '.join(needs)}, which the {name} backend does not "
                               f"offer; run it with --backend hf (backend='hf')")
