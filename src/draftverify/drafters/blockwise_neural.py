"""BPD drafts locally rescored by a small neural LM (paper section 7.1, Algorithm 2).

Each head j proposes its top-k set S_j; the draft model, conditioned on the committed text and the draft chosen so
far, scores S_j, and the draft takes argmax over S_j of z_j + alpha * r_j (heads' logits z, rescorer's logits r):
greedy rescoring, one small-model forward per draft token. The draft stays a deterministic candidate (q one-hot),
so the greedy and speculative-sampling verifiers keep the output exact.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..backends.base import LMBackend
from ..errors import DraftVerifyError, check_number
from ..types import DecodingState, Draft, Verdict
from .base import DraftModel, empty_draft
from .blockwise import BlockwiseDrafter, BlockwiseHeads, load_heads
from .draft_options import draft_model_backend
from .model import ModelDrafter


def rescore_locally(
    z: torch.Tensor, k: int, alpha: float, next_logits: Callable[[torch.Tensor | None], torch.Tensor]
) -> torch.Tensor:
    """Algorithm 2, greedy, each row on its own: z [B, n, V] heads' logits; next_logits(the token chosen last [B, 1],
    None before the first) -> the rescorer's logits r [B, V] for the next draft position. Returns the chosen tokens
    [B, n], each argmax over S_j = top-k(z_j) of z_j + alpha * r."""
    z_top, candidates = z.topk(min(k, z.shape[-1]), dim=-1)  # [B, n, k] logits and token ids of each S_j
    chosen: list[torch.Tensor] = []
    for j in range(z.shape[1]):
        r = next_logits(chosen[-1] if chosen else None)  # [B, V]
        pick = (z_top[:, j] + alpha * r.gather(1, candidates[:, j])).argmax(dim=-1, keepdim=True)  # [B, 1]
        chosen.append(candidates[:, j].gather(1, pick))  # [B, 1]
    return torch.cat(chosen, dim=1)


class BlockwiseNeuralDrafter(BlockwiseDrafter):
    """Heads' top-k candidates per position, chosen left to right by heads' logits + alpha * the draft model's.
    In a batch each row is rescored by its own text (the draft model decodes the rows as `model` does)."""

    supports_batch = True
    drafts_in_target_pass = False  # the rescorer runs one forward per draft token: drafting has a cost again

    def __init__(self, heads: BlockwiseHeads, rescorer: LMBackend, k: int = 4, alpha: float = 1.0):
        super().__init__(heads)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DraftVerifyError(f"neural rescoring needs k >= 1 candidates per head, got {k!r}")
        self.rescorer = ModelDrafter(rescorer)  # its rows, cache feeding and commit
        self.lm = self.rescorer.lm
        self.k = k
        self.alpha = check_number("rescoring weight alpha", alpha, 0.0)

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "BlockwiseNeuralDrafter":
        rescorer = draft_model_backend(options, cls.name, "bpd_neural rescores with a small LM")
        return cls(load_heads(options), rescorer, options.lattice_k, options.rescore_weight)

    def bind(self, target: LMBackend, max_positions: int) -> None:
        super().bind(target, max_positions)
        self.rescorer.bind(target, max_positions)

    def models(self) -> list[DraftModel]:
        return [DraftModel(self.lm, lags=True)]  # catches up on each step's committed tokens in its first forward

    def start(self, state: DecodingState, prefilled=None) -> None:
        super().start(state, prefilled)
        self.rescorer.start(state)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._hidden is None:
            return empty_draft(state)
        unseen, new_valid = self.rescorer.unseen(state)  # the committed tokens the rescorer has not seen yet

        def next_logits(last: torch.Tensor | None) -> torch.Tensor:
            self.forward_calls += 1
            if last is None:
                return self.lm.forward(unseen, new_valid=new_valid, logits_to_keep=1).logits[:, -1]  # [B, V]
            return self.lm.forward(last).logits[:, -1]

        return Draft(tokens=rescore_locally(self.head_logits()[:, :gamma], self.k, self.alpha, next_logits))

    def commit(self, state: DecodingState, verdict: Verdict, scored=None) -> None:
        super().commit(state, verdict, scored)
        self.rescorer.commit(state, verdict)

    def drop_rows(self, keep: torch.Tensor) -> None:
        super().drop_rows(keep)
        self.rescorer.drop_rows(keep)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        super().join_rows(input_ids, attention_mask)
        self.rescorer.join_rows(input_ids, attention_mask)
