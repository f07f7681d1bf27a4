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
  commit and length); `rows_take_trees` (True where undeclared) says that its rows score token trees too;
- `exposes_hidden`: returns the last hidden state (drafters with heads on the target's hidden states);
- `has_modules`: answers the module calls of `ModuleBackend` (its weights' dtype, its token embedding and LM head,
  a backend over its first layers, an encoder-decoder's encoder states), which drafters with weights of their
  own read through (blockwise heads on the target's LM head, the NAT drafter, early exit, BiTA's adapter).

One optional flag (read with `computes_in_torch`, True where a backend does not declare it): `computes_in_torch`
says whether the forward runs on torch's intra-op threads. When no model of a generation does (llama.cpp), the loop
runs its own small tensor ops on one torch thread (loop.py).

And `takes_host_ids` (read with `takes_host_ids`, False where undeclared): the forward of a chain takes its tokens
as Python ints ([B][n] lists) besides a tensor: a backend that reads token ids on the host (llama.cpp's batch) then
costs the step no tensor made from host ints only to be read back.

One more (read with `defers_prefill`, False where undeclared): `defers_prefill` says that start() only records the
prompt and the first forward decodes it together with its own tokens (one decode fewer per request); the loop then
counts that first step's time as the prefill's and keeps it out of the length policy's cost model.

And `wrap_verifier` (a method, read with `wrap_verifier`; the verifier as it is where undeclared): a backend
whose verdicts need more than the rule reading its logits wraps the loop's verifier, as a method that changes the
target's forward wraps the target (Drafter.wrap_target). llama.cpp's tree pass may round a node's logits
otherwise than one-token decoding, and its wrapper settles a greedy tree verdict against a chain's
(llamacpp_settle.py); the step keeps its four verbs.

And `take_prompt_logits` (a method; a backend without it gives no prompt log-probabilities, engine/logprobs.py
says so): asked with start(..., prompt_logits=True) or join_rows(..., prompt_logits=True), a backend keeps the
prefill's logits at every prompt position but the last and hands them over once, per row, after the forward that
decoded them (llama.cpp decodes a deferred prompt with the first step's forward). The loop passes prompt_logits only
when a row asks, so a backend without the method never receives it.

And `dear_width` (read with `dear_width`, False where undeclared): a forward's cost grows steeply with the tokens
it scores (llama.cpp's CPU forward, benchmarks/cost), so a drafter whose settings trade how often it drafts for how
sure its drafts are (the suffix cache's match length) defaults to drafting seldom and sure there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import DraftVerifyError
from ..types import TargetOutput

if TYPE_CHECKING:
    from ..verifiers.base import Verifier


@runtime_checkable
class LMBackend(Protocol):
    """One model and its cache (target or draft). Invariant between steps: the cache holds every committed token
    but the last (the pending token, which the next forward scores first)."""

    name: str  # its name in the backend registry (backends/registry.py): "hf", "llamacpp", "lean"
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

    def start(
        self, input_ids: torch.Tensor, want_hidden: bool = False, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Reset and prefill input_ids [B, L] (all but the last token); return the committed tokens [B, L0]."""

    def forward(
        self,
        tokens: torch.Tensor | list[list[int]],
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | list[list[bool]] | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Append tokens [B, n] to the uncommitted tail; their next-token logits [B, n, V]. tokens and new_valid
        come as Python lists only to a backend that declares takes_host_ids (a chain: no position_ids, no mask).

        logits_to_keep k > 0: the logits of the last min(k, n) positions only [B, min(k, n), V], as Hugging Face's
        argument of that name (0: all n). A draft model catching up on the committed tokens it has not seen reads
        only the last one's, and the output layer over the vocabulary is most of a small draft's cost per row.

        position_ids [B or 1, n]: absolute positions (None: after the tail, as a chain); attention_mask bool
        [n, tail + n] over the tail and the new tokens (None: causal); every committed position is always visible.

        The logits hold until this backend's next forward: a backend may hand back a view of its own output buffer
        (llama.cpp's, as llama_get_logits does), so a caller that keeps them longer clones them. `prefilled` is
        the backend's own copy.
        """

    def commit(self, kept: int | torch.Tensor) -> None:
        """Keep the tail's first `kept` positions (a chain), or the tail offsets kept [B, k] / [k] in order (a
        tree's accepted branch), drop the rest of the tail and settle."""

    @property
    def row_length(self) -> torch.Tensor:
        """Positions each row holds [B] (its next position id)."""

    def commit_rows(self, counts: torch.Tensor | list[int]) -> None:
        """Row b keeps its tail's first counts[b] positions [B] (a chain), drops the rest and settles. counts: a
        tensor or Python ints (the loop's, read off the verdict on the host)."""

    def truncate_rows(self, upto: torch.Tensor) -> None:
        """Row b keeps its first upto[b] positions [B] (at least what it committed) and settles."""

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        """Keep the rows where keep_rows [B] (bool) is True, between steps (finished rows leave)."""


@dataclass(frozen=True)
class TargetModules:
    """A model's token embedding and output layer: what a drafter with layers of its own reads tokens through and
    scores its outputs with (frozen, never copied, so the drafter's files hold only its own weights)."""

    input_embeddings: nn.Module  # token ids [...] -> embeddings [..., H]
    output_embeddings: nn.Module  # the LM head: hidden states [..., H] -> logits [..., V]
    logits_bias: torch.Tensor | None = None  # [1, V], added after the LM head (BART / Marian), or None

    @classmethod
    def of(cls, model: Any) -> "TargetModules":  # a transformers PreTrainedModel (the core imports no transformers)
        """A Hugging Face model's (its get_input_embeddings, get_output_embeddings and final_logits_bias)."""
        return cls(
            model.get_input_embeddings(), model.get_output_embeddings(), getattr(model, "final_logits_bias", None)
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer on hidden [..., H] -> logits [..., V], in the LM head's dtype."""
        weight = self.output_embeddings.weight
        assert isinstance(weight, torch.Tensor)  # an LM head holds its weight as a tensor
        logits = self.output_embeddings(hidden.to(weight.dtype))
        return logits if self.logits_bias is None else logits + self.logits_bias.to(logits.dtype)


@runtime_checkable
class ModuleBackend(LMBackend, Protocol):
    """The calls of a backend whose `has_modules` is True: what drafters with weights of their own need of the
    target's internals. A backend without them says so with has_modules = False, and `check_backend` refuses the
    methods that need them at load time."""

    dtype: torch.dtype  # its weights' dtype, which a drafter's own weights are cast to

    def modules(self) -> TargetModules:
        """Its token embedding, LM head and logits bias (blockwise heads, the NAT drafter)."""

    def first_layers(self, count: int, role: str, compile: bool = False) -> LMBackend:
        """A backend over this model's first `count` decoder layers, then its own final norm and LM head, sharing
        its weights and keeping a cache of its own (early exit's draft)."""

    def encoder_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder-decoder models: this generation's encoder states [B, S, H] and source mask [B, S], set by
        start()."""

    def module(self) -> nn.Module:
        """The whole model, for a peer that runs it on its own (the bench's Hugging Face generate rows); drafters
        use the calls above."""


def require_modules(backend: LMBackend, needs: str) -> ModuleBackend:
    """The backend as a ModuleBackend, or a one-line error naming what needs its modules and a backend that has
    them (for drafters built by hand, which check_backend never saw)."""
    if not getattr(backend, "has_modules", False):
        name = getattr(backend, "name", type(backend).__name__)
        raise DraftVerifyError(
            f"{needs} needs the target's modules, which the {name} backend does not offer; run "
            f"it with --backend hf (backend='hf')"
        )
    return backend  # type: ignore[return-value]


def kept_positions(logits_to_keep: int, n: int) -> int:
    """How many of a forward's n positions get logits under forward(..., logits_to_keep) (LMBackend.forward): the
    last min(k, n) for k > 0, else all n."""
    return min(logits_to_keep, n) if logits_to_keep > 0 else n


def host_ints(values) -> list[int]:
    """Per-row values [B] (a tensor, a sequence of ints, or one int) as Python ints."""
    if isinstance(values, torch.Tensor):
        return values.reshape(-1).tolist()
    if isinstance(values, int):
        return [values]
    return [int(v) for v in values]


def one_row(values, name: str) -> int:
    """The one entry of a one-row backend's per-row values [1] (a tensor or ints), as an int."""
    if type(values) is list and len(values) == 1 and type(values[0]) is int:  # the loop's own counts
        return values[0]
    ints = host_ints(values)
    if len(ints) != 1:
        raise DraftVerifyError(f"{name} has {len(ints)} entries for a backend that holds one row")
    return ints[0]


class OneRow:
    """The protocol's row calls for a backend that holds one row, in terms of its commit and length."""

    supports_rows = False
    # what the backend itself declares (annotations only: the backend's own attributes and methods are the ones read)
    name: str
    device: torch.device
    length: int  # positions in its cache
    committed: int  # of them, the settled ones
    commit: Callable[[int], None]

    @property
    def row_length(self) -> torch.Tensor:
        return torch.tensor([self.length], device=self.device)

    def commit_rows(self, counts: torch.Tensor | list[int]) -> None:
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


def dear_width(backend: object) -> bool:
    """Whether a backend's forward grows steeply dearer with the tokens it scores (its optional flag)."""
    return bool(getattr(backend, "dear_width", False))


def wrap_verifier(backend: object, verifier: Verifier) -> Verifier:
    """The verifier whose verdicts the loop takes on this backend: the backend's own wrapper around `verifier`
    where it declares one (its optional method wrap_verifier), else `verifier`."""
    wrap = getattr(backend, "wrap_verifier", None)
    return verifier if wrap is None else wrap(verifier)


def takes_host_ids(backend: object) -> bool:
    """Whether a backend's forward takes the tokens of a chain as Python ints, [B][n] lists, besides a tensor (its
    optional flag). Read off the backend's class, so a wrapper (which forwards attribute reads to the backend it
    wraps) is handed tensors unless it declares the flag itself."""
    return bool(getattr(type(backend), "takes_host_ids", False))


def is_compiled(backend: object) -> bool:
    """Whether a backend runs compiled graphs that --compile plans and warms up (its optional flag `compiled`;
    False when undeclared: only the hf backend compiles)."""
    return bool(getattr(backend, "compiled", False))


def is_backend(obj: object) -> bool:
    """Whether obj answers the protocol. A runtime Protocol check walks every member (tens of microseconds, paid
    per request), so the answer is kept per class: a backend's members are its class's and its constructor's."""
    kind = type(obj)
    if kind not in _BACKEND_CLASSES:
        _BACKEND_CLASSES[kind] = isinstance(obj, LMBackend)
    return _BACKEND_CLASSES[kind]


_BACKEND_CLASSES: dict[type, bool] = {}


def check_backend(target: LMBackend | type, drafter_cls: type, method: str, batched: bool = False) -> None:
    """Refuse, before anything runs, a method whose drafter needs what this kind of target backend lacks.

    target: a backend or its class; the flags its class declares are read (what the backend offers). What one
    model cannot do on a backend that can (a T5 on the hf backend takes no positions) is the drafter's bind's to
    refuse, with that model's reason."""
    kind = target if isinstance(target, type) else type(target)
    name = getattr(kind, "name", kind.__name__)

    def offers(flag: str) -> bool:
        return bool(getattr(kind, flag, True))  # a flag set per model (in __init__) is not the backend's to refuse

    needs = []
    modules = getattr(drafter_cls, "needs_target_modules", "")
    if modules and not offers("has_modules"):
        needs.append(modules)
    elif (
        getattr(drafter_cls, "needs_target_hidden", False)
        and not getattr(drafter_cls, "hidden_from_wrapper", False)
        and not offers("exposes_hidden")
    ):
        needs.append("the target's hidden states")
    if getattr(drafter_cls, "proposes_trees", False) and not offers("takes_positions"):
        needs.append("token trees (explicit positions and an ancestor mask)")
    if batched and not offers("supports_rows"):
        needs.append("batches of several rows")
    elif batched and getattr(drafter_cls, "proposes_trees", False) and not offers("rows_take_trees"):
        needs.append("token trees in batches of several rows")
    if needs:
        raise DraftVerifyError(
            f"method {method!r} needs {' and '.join(needs)}, which the {name} backend does not "
            f"offer; run it with --backend hf (backend='hf')"
        )
