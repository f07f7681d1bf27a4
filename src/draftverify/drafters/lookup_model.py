"""Copy when the context repeats itself, otherwise ask the draft model: prompt lookup and a draft LM combined.

On code the two are complementary: lookup drafts long, free, often-accepted runs where text repeats (names,
signatures, boilerplate) and has nothing to offer elsewhere, where the draft model's cost is worth paying.
Each step takes the lookup's draft when its n-gram matches and the model's draft otherwise; the model's cache
catches up lazily on the tokens it skipped (ModelDrafter feeds every committed token it has not seen), so a
lookup step costs no model forward. Proposals are exact drafts like any other: the verifier keeps the output
equal to the target's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..backends.base import LMBackend
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, DraftModel
from .draft_options import draft_model_backend
from .model import ModelDrafter
from .prompt_lookup import PromptLookupDrafter


class LookupModelDrafter(Drafter):
    supports_batch = True

    def __init__(
        self, model: LMBackend | nn.Module, max_ngram: int = 3, min_ngram: int = 2, fallback_threshold: float = 0.0
    ):
        super().__init__()
        self.lookup = PromptLookupDrafter(max_ngram, min_ngram)
        self.model = ModelDrafter(model, fallback_threshold)
        self.lookup_steps = 0  # steps drafted by copying (the rest were drafted by the model)

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "LookupModelDrafter":
        draft = draft_model_backend(options, cls.name)
        return cls(draft, options.prompt_lookup_max_ngram, options.lookup_model_min_ngram, options.alpha_fb)

    @property
    def computes_in_torch(self) -> bool:
        return self.model.computes_in_torch

    def bind(self, target: LMBackend, max_positions: int) -> None:
        self.model.bind(target, max_positions)

    def models(self) -> list[DraftModel]:
        return [DraftModel(m.lm, lags=True) for m in self.model.models()]  # idle on lookup steps, then catches up

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self.lookup_steps = 0
        self.model.start(state, prefilled)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        """Rows whose n-gram recurs copy, the others take the draft model's tokens; the model drafts only when
        some row needs it (its drafts in the copying rows are then discarded at commit)."""
        copied = self.lookup.propose(state, gamma)
        batch = state.tokens.shape[0]
        copy_len = torch.zeros(batch, dtype=torch.long, device=state.tokens.device)
        if copied.length:
            copy_len = copied.lengths if copied.lengths is not None else copy_len + copied.length
        copying = copy_len > 0
        if bool(copying.all()):
            self.lookup_steps += 1
            return copied
        before = self.model.forward_calls
        drafted = self.model.propose(state, gamma)
        self.forward_calls += self.model.forward_calls - before
        if not bool(copying.any()) or drafted.length == 0:
            return drafted if drafted.length else copied
        self.model.discard = copying
        width = max(drafted.length, copied.length)
        tokens = state.tokens.new_zeros((batch, width))
        tokens[:, : drafted.length] = drafted.tokens
        rows = copying.nonzero().flatten()
        tokens[rows, : copied.length] = copied.tokens[rows]
        q = None  # a greedy draft's tokens are deterministic proposals, as copied ones are: q one-hot at each
        if drafted.q_probs is not None:
            q = drafted.q_probs.new_zeros((batch, width, drafted.q_probs.shape[-1]))
            q[:, : drafted.length] = drafted.q_probs
            q[rows] = 0.0  # a copied token is a deterministic proposal: q one-hot at it
            q[rows, : copied.length] = torch.nn.functional.one_hot(copied.tokens[rows], q.shape[-1]).to(q.dtype)
        model_len = drafted.lengths if drafted.lengths is not None else torch.full_like(copy_len, drafted.length)
        lengths = torch.where(copying, copy_len, model_len.to(copy_len.device))  # the model's rows may end early
        return Draft(tokens=tokens, q_probs=q, lengths=lengths)

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        self.model.commit(state, verdict, scored)

    def drop_rows(self, keep) -> None:
        self.model.drop_rows(keep)

    def join_rows(self, input_ids, attention_mask) -> None:
        self.model.join_rows(input_ids, attention_mask)
