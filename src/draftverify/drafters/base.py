"""The drafter interface: propose up to gamma tokens, then hear which were kept."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from ..backends.base import LMBackend, computes_in_torch
from ..types import DecodingState, Draft, TargetOutput, Verdict


class DraftModel(NamedTuple):
    """A model a drafter calls, as compiling and the bench's warm-up read it (Drafter.models)."""

    lm: LMBackend
    # it sits idle while another drafter drafts and then catches up on many tokens in one forward (lookup_model's
    # draft model), so its compiled widths are every bucket
    lags: bool = False


def empty_draft(state: DecodingState) -> Draft:
    """No draft tokens [B, 0] (a plain decoding step), made of host lists: no tensor unless one is read; the state's
    one for its batch size (DecodingState.empty_draft)."""
    return state.empty_draft()


class Drafter(ABC):
    """Subclasses are declared with registry.register_methods (options/<family>.py). `forward_calls` counts model
    forwards (0 if model-free)."""

    name: str = "?"
    proposes_trees: bool = False  # Leviathan's chain theory (Theorem 8) does not predict these
    needs_target_hidden: bool = False  # heads / BiTA read the target's hidden states: commit() receives them
    hidden_from_wrapper: bool = False  # the target wrap_target() returns makes those hidden states (eagle3)
    drafts_in_target_pass: bool = False  # the draft comes out of the verify forward itself (no separate cost)
    drafts: bool = True  # False: it never proposes a token (autoregressive), so the loop never asks it to
    supports_batch: bool = False  # drafts for a batch of several left-padded rows (DecodingState.lengths)
    # what of a Hugging Face target's modules the drafter reads or extends (a phrase for messages), or "" when it
    # talks to the target through the backend protocol only (backends/base.py), so any backend can run it
    needs_target_modules: str = ""
    # the longest draft a learning length policy (auto, conf) may choose for this drafter, or None: the policy's own
    # bound. A drafter whose drafts cost nothing per position and end themselves where they grow unsure (the
    # suffix cache on a dear-width backend) declares the engine's widest draft, so the cost model, not a bound
    # tuned for draft models (each position a forward), sets how long its sure copies run
    longest_draft: int | None = None

    def __init__(self) -> None:
        self.forward_calls = 0

    @property
    def computes_in_torch(self) -> bool:
        """Whether proposing runs tensor work on torch's intra-op threads: a drafter with draft models (models())
        asks their backends; model-free lookups override this with False; any other drafter says True."""
        models = self.models()
        return True if not models else any(computes_in_torch(m.lm) for m in models)

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "Drafter":
        """Build from a methods.MethodOptions (the CLI / load() path); reads only this drafter's fields."""
        return cls()

    def bind(self, target: LMBackend, max_positions: int) -> None:
        """Check compatibility with the target before generation starts (vocabulary, context length)."""

    def models(self) -> list[DraftModel]:
        """The draft models this drafter calls, each once (what --compile plans and compiles beside the target);
        none for a drafter that runs no model of its own."""
        return []

    def verify_width(self, longest: int) -> int:
        """The widest verify forward of a step whose drafts hold at most `longest` tokens: the draft and the
        pending token (a drafter that merges several continuations into one tree counts each)."""
        return longest + 1

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        """Called once after the target's prefill.

        prefilled (only for needs_target_hidden drafters): the target's logits at the last prefilled position
        [B, 1, V], the one before the pending token, and its hidden states at every prefilled position [B, L-1, H];
        None when nothing was prefilled.
        """

    @abstractmethod
    def propose(self, state: DecodingState, gamma: int) -> Draft:
        """Return at most gamma tokens continuing state.tokens."""

    def wrap_target(self, target: LMBackend) -> LMBackend:
        """The target the loop decodes with, given the one it was handed (called once per generation, before
        bind): itself, or a backend wrapping it when the method changes the target's forward (BiTA appends its
        mask tokens to every verify pass: drafters/extra_positions.py). Outputs a wrapper appends after the
        scored positions reach commit() after those of the kept positions."""
        return target

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        """state.tokens now includes the verdict's emitted tokens; drop anything the drafter holds beyond them.

        A step may have had no propose() call (gamma auto chose 0: a plain decoding step with an empty draft); the
        drafter then catches up on the committed tokens at its next proposal.

        scored (only for needs_target_hidden drafters): the target's logits and hidden states at the pending
        token and the kept draft tokens [B, 1 + num_accepted, ...], then at the positions a wrapping target
        (wrap_target) appended [B, E, ...]; the next draft can be prepared from them here, at no extra target call.
        """

    def timers(self) -> dict[str, float]:
        """Cumulative seconds of named parts of the drafter's own work that GenerationStats reports apart as
        time_<name> (part of time_draft); see add_drafter_times. Empty for most drafters."""
        return {}

    def forget(self) -> None:
        """Drop what earlier generations taught the drafter (a cache shared across requests, drafters/suffix.py),
        between generations: the main bench measures each prompt on its own. Nothing for most drafters."""

    def drop_rows(self, keep: torch.Tensor) -> None:
        """Batches: keep only the rows where keep [B] (bool) is True; finished rows leave between steps."""

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Batches: new left-padded prompt rows [b, L] join at the end of the batch between steps (continuous
        batching); a drafter with a cache prefills them like start() does."""


class NoDrafter(Drafter):
    """Plain autoregressive decoding with the target in our loop (the no-drafting baseline)."""

    supports_batch = True
    computes_in_torch = False
    drafts = False

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        return empty_draft(state)


def add_drafter_times(stats, drafter: Drafter, before: dict[str, float]) -> None:
    """Add what the drafter's timers() gained since `before` (its timers() when the generation began) to stats."""
    for name, seconds in drafter.timers().items():
        field = f"time_{name}"
        setattr(stats, field, getattr(stats, field) + seconds - before.get(name, 0.0))


def stack_draft(tokens: list[torch.Tensor], q: list[torch.Tensor] | None, state: DecodingState) -> Draft:
    """tokens: N tensors [B]; q: N tensors [B, V] -> Draft(tokens [B, N], q_probs [B, N, V])."""
    if not tokens:
        return empty_draft(state)
    return Draft(tokens=torch.stack(tokens, dim=1), q_probs=torch.stack(q, dim=1) if q is not None else None)
