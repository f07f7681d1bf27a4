"""BPD drafts locally rescored by a small neural LM (paper section 7.1, Algorithm 2).

Each head j proposes its top-k set S_j; the draft model, conditioned on the committed text and the draft chosen so
far, scores S_j, and the draft takes argmax over S_j of z_j + alpha * r_j (heads' logits z, rescorer's logits r):
greedy rescoring, one small-model forward per draft token. The draft stays a deterministic candidate (q one-hot),
so the greedy and speculative-sampling verifiers keep the output exact.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..backends.lean_draft import draft_backend
from ..cached_lm import CachedLM
from ..errors import DraftVerifyError, check_number
from ..registry import register_drafter
from ..types import DecodingState, Draft, Verdict
from .base import empty_draft
from .blockwise import BlockwiseDrafter, BlockwiseHeads, load_heads
from .model import ModelDrafter, require_shared_vocabulary


def rescore_locally(z: torch.Tensor, k: int, alpha: float, next_logits: Callable[[list[int]], torch.Tensor]) -> list[int]:
    """Algorithm 2, greedy: z [n, V] heads' logits; next_logits(chosen so far) -> the rescorer's logits r [V] for
    the next draft position. Returns the n chosen tokens, each argmax over S_j = top-k(z_j) of z_j + alpha * r."""
    z_top, candidates = z.topk(min(k, z.shape[-1]), dim=-1)  # [n, k] logits and token ids of each S_j
    chosen: list[int] = []
    for j in range(z.shape[0]):
        r = next_logits(chosen)  # [V]
        chosen.append(int(candidates[j, (z_top[j] + alpha * r[candidates[j]]).argmax()]))
    return chosen


@register_drafter("bpd_neural")
class BlockwiseNeuralDrafter(BlockwiseDrafter):
    """Heads' top-k candidates per position, chosen left to right by heads' logits + alpha * the draft model's."""

    supports_batch = False  # the draft model rescores one row

    drafts_in_target_pass = False  # the rescorer runs one forward per draft token: drafting has a cost again

    def __init__(self, heads: BlockwiseHeads, rescorer: CachedLM, k: int = 4, alpha: float = 1.0):
        super().__init__(heads)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DraftVerifyError(f"neural rescoring needs k >= 1 candidates per head, got {k!r}")
        self.lm = rescorer
        self.k = k
        self.alpha = check_number("rescoring weight alpha", alpha, 0.0)

    @classmethod
    def from_options(cls, target: CachedLM, options) -> "BlockwiseNeuralDrafter":
        if options.draft_model is None:
            raise DraftVerifyError("bpd_neural rescores with a small LM: pass draft=... (CLI: --draft PATH)")
        require_shared_vocabulary(options, cls.name)
        rescorer = draft_backend(options.draft_model, "draft", options.compile, options.lean_draft)
        return cls(load_heads(options), rescorer, options.lattice_k, options.rescore_weight)

    def bind(self, target: CachedLM, max_positions: int) -> None:
        super().bind(target, max_positions)
        ModelDrafter.check_pair(self.lm, target, max_positions)

    def start(self, state: DecodingState, prefilled=None) -> None:
        super().start(state, prefilled)
        self.lm.start(state.tokens)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._hidden is None:
            return empty_draft(state)
        if state.tokens.shape[0] != 1:
            raise DraftVerifyError("neural rescoring drafts one sequence at a time (batch size 1)")

        def next_logits(chosen: list[int]) -> torch.Tensor:
            # the committed tokens the rescorer has not seen yet, then one chosen draft token at a time
            fed = state.tokens[:, self.lm.length :] if not chosen else state.tokens.new_tensor([chosen[-1:]])
            self.forward_calls += 1
            return self.lm.forward(fed).logits[0, -1]

        chosen = rescore_locally(self.head_logits()[0, :gamma], self.k, self.alpha, next_logits)
        return Draft(tokens=state.tokens.new_tensor([chosen]))  # [1, n]

    def commit(self, state: DecodingState, verdict: Verdict, scored=None) -> None:
        super().commit(state, verdict, scored)
        self.lm.commit(min(self.lm.length, state.tokens.shape[1] - 1) - self.lm.committed)
