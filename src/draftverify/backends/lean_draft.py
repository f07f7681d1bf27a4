"""Which backend a drafter's Hugging Face draft model runs on: LeanLM where it applies, CachedLM otherwise.

`draft_backend` is what the drafters' from_options and the bench call for a draft model. LeanLM (lean.py) runs a
Llama / Mistral / Qwen2 draft in a few plain torch ops per layer, without the Python overhead of a Hugging Face
forward that a small draft's forward is mostly made of. It is used for draft models only, eager,
on the hf backend; everything else keeps CachedLM: other architectures, encoder-decoder models, --compile (a
compiled CachedLM has its own kernels), batches of several rows (LeanDraft hands those to the model's CachedLM)
and, always, the target, whose greedy output must equal HF generate token for token.

Off switch: `lean_draft=False` (MethodOptions; load(..., lean_draft=False); CLI --no-lean-draft), or
DRAFTVERIFY_LEAN_DRAFT=0 for a process (the bench reads only this).
"""

from __future__ import annotations

import os

import torch

from ..errors import DraftVerifyError
from ..types import TargetOutput
from .hf.cached_lm import CachedLM, cached_model
from .lean import LeanLM
from .lean_weights import unsupported

ENV_SWITCH = "DRAFTVERIFY_LEAN_DRAFT"  # "0" keeps every draft model on CachedLM


def lean_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def lean_reason(model, compile: bool = False, lean: bool = True) -> str | None:
    """Why this draft model does not run on LeanLM (a phrase), or None when it does."""
    from transformers import PreTrainedModel

    if not lean or not lean_enabled():
        return "switched off (lean_draft=False or DRAFTVERIFY_LEAN_DRAFT=0)"
    if compile:
        return "--compile compiles CachedLM's forward"
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a Hugging Face model"
    return unsupported(model)


def draft_backend(model, role: str = "draft", compile: bool = False, lean: bool = True):
    """The backend for a drafter's draft model: a LeanDraft where LeanLM applies (lean_reason), else what
    cached_model gives (a CachedLM, or any backend given in, as it is)."""
    if lean_reason(model, compile, lean) is None:
        return LeanDraft(model, role)
    return cached_model(model, role, compile)


class LeanDraft:
    """A draft model's backend: one row on LeanLM; a batch of several rows (or a padded one) on the same model's
    CachedLM, built at the first batch. When rows join a lone row between steps (continuous batching), that row
    moves to CachedLM: the tokens LeanLM holds are prefilled there (one draft prefill), then the rows join."""

    name = "lean"
    takes_positions = True
    supports_rows = True  # through CachedLM
    exposes_hidden = False
    has_modules = False
    is_encoder_decoder = False

    def __init__(self, model, role: str = "draft"):
        self.lean = LeanLM(model, role)
        self.model = model
        self.role = role
        self.device = self.lean.device
        self.vocab_size = self.lean.vocab_size
        self.max_positions = self.lean.max_positions
        self._rows: CachedLM | None = None
        self._fits: int | None = None  # the last check_fits request, for a CachedLM built later
        self.active: LeanLM | CachedLM = self.lean  # the one that holds the current request

    @property
    def length(self) -> int:
        return self.active.length

    @property
    def committed(self) -> int:
        return self.active.committed

    @property
    def prefilled(self) -> TargetOutput | None:
        return self.active.prefilled

    @property
    def row_length(self) -> torch.Tensor:
        return self.active.row_length

    def rows_lm(self) -> CachedLM:
        """The model's CachedLM, for batches."""
        if self._rows is None:
            self._rows = CachedLM(self.model, role=self.role)
            if self._fits is not None:
                self._rows.check_fits(self._fits)
        return self._rows

    def check_fits(self, decoder_positions: int) -> None:
        self._fits = decoder_positions
        self.lean.check_fits(decoder_positions)
        if self._rows is not None:
            self._rows.check_fits(decoder_positions)

    def start(
        self, input_ids: torch.Tensor, want_hidden: bool = False, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch = input_ids.shape[0] > 1 or attention_mask is not None
        self.active = self.rows_lm() if batch else self.lean
        return self.active.start(input_ids, want_hidden=want_hidden, attention_mask=attention_mask)

    def forward(self, tokens: torch.Tensor, *args, **kwargs) -> TargetOutput:
        return self.active.forward(tokens, *args, **kwargs)

    def commit(self, kept) -> None:
        self.active.commit(kept)

    def rollback(self, length: int) -> None:
        self.active.rollback(length)

    def commit_rows(self, counts: torch.Tensor | list[int]) -> None:
        self.active.commit_rows(counts)

    def truncate_rows(self, upto: torch.Tensor) -> None:
        self.active.truncate_rows(upto)

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        self.active.drop_rows(keep_rows)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        if self.active is self.lean:
            if self.lean.length != self.lean.committed:
                raise DraftVerifyError("rows join between steps only (the tail is not committed)")
            fed = self.lean.fed_tokens()  # [1, length]
            rows = self.rows_lm()
            rows.start(torch.cat([fed, fed.new_zeros((1, 1))], dim=1))  # caches all but the last: exactly `fed`
            self.active = rows
        self.active.join_rows(input_ids, attention_mask)
