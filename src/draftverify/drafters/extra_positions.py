"""A target whose verify passes carry extra embedded positions after the scored tokens (BiTA's mask tokens), so the
decoding loop and every other backend's forward never hear of them: the method wraps the target, as Medusa's
MedusaModel and EAGLE's EaModel wrap theirs.

The extra positions are given as embeddings with their own positions and visibility, and optionally a deep prompt
(per-layer keys and values) that only they see; they are never committed. The scored tokens never see them, so the
target's outputs there are what they would be without them; the extras' outputs come back after the scored ones
(the loop hands them to the drafter's commit after the kept positions'). Running them takes a backend with an
embedded-positions forward (`forward_extra`: the Hugging Face backend, CachedLM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backends.base import LMBackend
from ..errors import DraftVerifyError
from ..types import PrefixKV, TargetOutput
from .wrapped_target import WrappedTarget


@dataclass
class VerifyExtras:
    """E extra positions of one verify pass over the pending token and N draft tokens."""

    embeds: torch.Tensor  # [B, E, H] input embeddings (learned vectors, not vocabulary tokens)
    positions: torch.Tensor  # [E] long, position offsets after the pending token's
    mask: torch.Tensor  # [E, 1+N+E] bool, which verify positions (pending, draft nodes, extras) each extra sees
    prefix: PrefixKV | None = None  # per layer (keys, values) [KV heads, P, head dim], seen by the extras only

    @property
    def count(self) -> int:
        return self.embeds.shape[1]


# extras(tree, draft length N, rows B): the extras of a verify pass over a tree (True) or a chain of N drafts
ExtrasFor = Callable[[bool, int, int], VerifyExtras]


class ExtraPositionsTarget(WrappedTarget):
    """The wrapped target with `extras` appended to every forward; everything else is the target's own."""

    def __init__(self, target: LMBackend, extras: ExtrasFor, method: str):
        if not callable(getattr(target, "forward_extra", None)):
            raise DraftVerifyError(
                f"{method} appends learned embeddings to the target's verify pass, which the "
                f"{target.name} backend does not take; run it with --backend hf (backend='hf')"
            )
        super().__init__(target)
        self.extras = extras

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """tokens [B, n] (the pending token and the draft, right after a commit) and then the extras: outputs
        [B, n + E, ...]. attention_mask [n, n] and position_ids [1, n] describe a tree; None: a chain. new_valid (a
        ragged chain's padding) is not used: the extras follow every row's n columns, so all of them are scored.
        logits_to_keep must be 0: the method reads the extras' outputs after the tokens'."""
        if logits_to_keep:
            raise DraftVerifyError(
                "a target with extra positions outputs every position: call it with logits_to_keep=0"
            )
        n = tokens.shape[1]
        if attention_mask is not None and tuple(attention_mask.shape[-2:]) != (n, n):
            raise DraftVerifyError(
                f"extra positions follow a verify pass right after a commit: its mask must be "
                f"[{n}, {n}], got {tuple(attention_mask.shape)}"
            )
        extras = self.extras(attention_mask is not None, n - 1, tokens.shape[0])
        if attention_mask is None:  # a chain, in causal order
            attention_mask = torch.ones(n, n, dtype=torch.bool).tril()
        if position_ids is None:
            position_ids = self.target.length + torch.arange(n)[None]
        width = n + extras.count
        mask = torch.zeros(width, width, dtype=torch.bool)  # [n + E, n + E]
        mask[:n, :n] = attention_mask.reshape(n, n)
        mask[n:] = extras.mask
        positions = torch.cat(
            [position_ids, self.target.length + extras.positions.to(position_ids.device)[None]], dim=1
        )  # [1, n + E]
        return self.target.forward_extra(tokens, positions, mask, extras.embeds, extras.prefix, want_hidden)
