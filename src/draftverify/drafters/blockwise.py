"""Blockwise parallel decoding (Stern et al. 2018; the drafter of "Exploring and improving drafts in blockwise
parallel decoding"): h prediction heads on a frozen target's last hidden state.

Head i predicts the token i positions after the one the hidden state was computed at. Head 1 is the target's
own next-token prediction, so only heads 2..h are extra weights: each is a one-hidden-layer feed-forward block
with a residual connection, read out through the target's own LM head (tied, as in the paper). The heads read
the hidden states of the verify pass itself (commit() receives them), so a BPD step costs one target forward.

Timing of a step: the verify pass keeps the pending token and the accepted drafts; the hidden state of the last
kept position predicts (head 1) the token the verifier emits after them, which becomes the next pending token,
and (heads 2..h) the h - 1 tokens after that: exactly the next draft. After prefill the same holds for the last
prefilled position, whose next token is the prompt's last (pending) token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..backends.base import LMBackend, require_modules
from ..backends.hf.few_row_linear import few_row_linears
from ..errors import DraftVerifyError
from ..sampling import probs_from_logits, sample
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, empty_draft
from .fingerprint import fingerprint_matches, weight_fingerprint
from .weights_folder import SavedModule, WeightsFolder

HEADS_FORMAT = "draftverify-bpd-heads"
MAX_HEADS = 9  # the paper's largest block (heads 1..9)
FOLDER = WeightsFolder("heads", HEADS_FORMAT, "blockwise heads", "draftverify train heads")


def lm_head_fingerprint(lm_head: nn.Module) -> str:
    """The LM head's fingerprint (fingerprint.py): ties a heads file or an adapter to the target it was trained on,
    whatever dtype and device either is loaded at."""
    return weight_fingerprint(lm_head.weight)


@dataclass(frozen=True)
class HeadsConfig:
    num_heads: int  # h, counting head 1 (the target itself): h - 1 trained heads
    hidden_size: int  # H, the target's last hidden state
    ffn_size: int  # F, each head's hidden layer
    vocab_size: int  # V, the target's LM head rows
    target_fingerprint: str  # lm_head_fingerprint of the target

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_heads, bool)
            or not isinstance(self.num_heads, int)
            or not 2 <= self.num_heads <= MAX_HEADS
        ):
            raise DraftVerifyError(
                f"blockwise decoding needs 2..{MAX_HEADS} heads (head 1 is the target), got {self.num_heads!r}"
            )
        for name in ("hidden_size", "ffn_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftVerifyError(f"heads config: {name} must be a positive integer, got {value!r}")


class BlockwiseHeads(SavedModule):
    """Heads 2..h: h_i = h + W2_i relu(W1_i h + b1_i) + b2_i; logits_i = lm_head(h_i). The LM head is the
    target's and is passed in, never stored, so saving the heads saves only their own weights (a few MB)."""

    weights_folder = FOLDER
    config_class = HeadsConfig

    def __init__(self, config: HeadsConfig):
        super().__init__(config)
        extra = config.num_heads - 1
        self.w1 = nn.Parameter(torch.empty(extra, config.hidden_size, config.ffn_size))  # [h-1, H, F]
        self.b1 = nn.Parameter(torch.zeros(extra, config.ffn_size))  # [h-1, F]
        self.w2 = nn.Parameter(torch.zeros(extra, config.ffn_size, config.hidden_size))  # [h-1, F, H]
        self.b2 = nn.Parameter(torch.zeros(extra, config.hidden_size))  # [h-1, H]
        nn.init.normal_(self.w1, std=config.hidden_size**-0.5)

    @classmethod
    def for_target(cls, target: nn.Module, num_heads: int = 4, ffn_size: int | None = None) -> "BlockwiseHeads":
        """Fresh heads sized for a target model; w2 = 0, so every head starts as a copy of head 1."""
        lm_head = target.get_output_embeddings()
        vocab, hidden = lm_head.weight.shape
        config = HeadsConfig(num_heads, hidden, ffn_size or hidden, vocab, lm_head_fingerprint(lm_head))
        return cls(config).to(lm_head.weight.dtype)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """hidden [..., H] -> logits [..., h-1, V] of heads 2..h."""
        x = hidden.to(self.w1.dtype)[..., None, :]  # [..., 1, H]
        inner = torch.relu(torch.einsum("...kh,khf->...kf", x, self.w1) + self.b1)  # [..., h-1, F]
        out = x + torch.einsum("...kf,kfh->...kh", inner, self.w2) + self.b2  # [..., h-1, H]
        return lm_head(out.to(lm_head.weight.dtype))

    def check_target(self, lm_head: nn.Module) -> None:
        """Refuse heads trained for another target (its LM head given): their hidden states and LM head would mean
        something else."""
        vocab, hidden = lm_head.weight.shape
        if (hidden, vocab) != (self.config.hidden_size, self.config.vocab_size):
            raise DraftVerifyError(
                f"the blockwise heads were trained for a target with hidden size {self.config.hidden_size} and "
                f"{self.config.vocab_size} tokens, but this target has {hidden} and {vocab}; train heads for it "
                "with `draftverify train heads`"
            )
        found = lm_head_fingerprint(lm_head)
        if not fingerprint_matches(self.config.target_fingerprint, lm_head.weight):
            raise DraftVerifyError(
                f"the blockwise heads were trained for another target (LM head fingerprint "
                f"{self.config.target_fingerprint}, this target's is {found}); train heads for it with "
                "`draftverify train heads`"
            )


class BlockwiseDrafter(Drafter):
    """Proposes heads 2..h's predictions from the hidden state of the last kept position (up to h - 1 tokens).

    Greedy: each head's argmax (the paper's Algorithm 1). Sampling: each head's token is drawn from its own
    filtered distribution, which is returned as q, so speculative sampling stays exact.
    """

    needs_target_modules = "the target's hidden states and LM head (the heads read them)"
    needs_target_hidden = True
    drafts_in_target_pass = True
    supports_batch = True  # each row's heads read its own last kept hidden state

    def __init__(self, heads: BlockwiseHeads):
        super().__init__()
        self.heads = heads.eval()
        self.lm_head: nn.Module | None = None
        self._hidden: torch.Tensor | None = None  # [B, H] at the position before the pending token
        self._joined = 0  # rows that joined since the last step: no hidden state yet, they draft nothing once

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "BlockwiseDrafter":
        return cls(load_heads(options))

    def bind(self, target: LMBackend, max_positions: int) -> None:
        target = require_modules(target, "blockwise decoding")
        if target.is_encoder_decoder:
            raise DraftVerifyError(
                "blockwise heads read a decoder-only target's last hidden state through its LM head; encoder-decoder "
                "targets (T5, BART, Marian) scale or bias the decoder output first: use a draft model instead"
            )
        self.lm_head = target.modules().output_embeddings
        self.heads.check_target(self.lm_head)
        self.heads.to(device=target.device, dtype=target.dtype)

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self._hidden = None if prefilled is None else prefilled.hidden[:, -1]
        self._joined = 0

    @torch.no_grad()
    def head_logits(self) -> torch.Tensor:
        """[B, h-1, V] logits of heads 2..h at the last kept position (the draft's lattice scores)."""
        rows = self._hidden.shape[0] * (self.heads.config.num_heads - 1)  # h-1 rows per sequence through the LM head
        with few_row_linears(self._hidden.device, self._hidden.dtype, rows=rows):
            return self.heads(self._hidden, self.lm_head)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._hidden is None:  # a one-token prompt: nothing was prefilled, so the first step drafts nothing
            return empty_draft(state)
        logits = self.head_logits()[:, :gamma]  # [B, n, V]
        if state.params.greedy:
            draft = Draft(tokens=logits.argmax(dim=-1))
        else:
            q = probs_from_logits(logits, state.params)  # [B, n, V]
            draft = Draft(tokens=sample(q, state.generator), q_probs=q)
        if self._joined:  # rows that just joined have no hidden state: they propose nothing this step
            lengths = torch.full((draft.tokens.shape[0],), draft.length, dtype=torch.long, device=draft.tokens.device)
            lengths[-self._joined :] = 0
            draft.lengths = lengths
        return draft

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        self._hidden = scored.hidden[:, -1]  # each row's last kept position (this drafter appends no extra positions)
        self._joined = 0

    def drop_rows(self, keep: torch.Tensor) -> None:
        if self._hidden is not None:
            self._hidden = self._hidden[keep.to(self._hidden.device)]

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        if self._hidden is not None:
            fresh = self._hidden.new_zeros((input_ids.shape[0], self._hidden.shape[1]))
            self._hidden = torch.cat([self._hidden, fresh])
            self._joined += input_ids.shape[0]


def load_heads(options) -> BlockwiseHeads:
    if options.heads_path is None:
        raise DraftVerifyError("blockwise decoding needs trained heads: pass heads_path=... (CLI: --heads DIR)")
    return BlockwiseHeads.load(options.heads_path)
