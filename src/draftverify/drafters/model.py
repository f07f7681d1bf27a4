"""A small Hugging Face LM drafts autoregressively with its own KV cache (Leviathan M_q; BiLD small model)."""
from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..backends.lean_draft import draft_backend
from ..cached_lm import CachedLM, cached_model
from ..errors import DraftVerifyError, check_number
from ..registry import register_drafter
from ..sampling import draw_next, probs_from_logits
from ..types import DecodingState, Draft, SamplingParams, Verdict
from .base import Drafter, stack_draft


def require_shared_vocabulary(options, drafter: str) -> None:
    """Drafters that read the draft model's logits over the target's vocabulary refuse a draft with its own."""
    if options.draft_tokenizer is not None:
        raise DraftVerifyError(
            f"the draft model has its own tokenizer, but the {drafter!r} drafter reads its probabilities over the "
            "target's vocabulary; use --method model (or cross_tokenizer) with it, or a draft trained with the "
            "target's tokenizer"
        )


@register_drafter("model")
class ModelDrafter(Drafter):
    """Drafts gamma tokens and returns their probabilities q (filtered exactly like the target's p).

    fallback_threshold is BiLD's alpha_FB: drafting stops before the first token whose max q is not above
    alpha_FB (Algorithm 1, line 4: small model's token only if max p_S > alpha_FB; section 3.3's prose says
    "< alpha_FB", the two differ only at equality), handing that position to the target. With the algorithm's
    form 0 never falls back and 1 always does, even when a float softmax rounds to exactly 1.

    The length policy's confidence stop (DecodingState.draft_confidence, gamma `conf`) is the same test used as a
    draft length: the draft ends *at* (not before) its first token whose max q is <= the threshold, and in a batch
    each row ends on its own (Draft.lengths) while the draft forward goes on for the rows still drafting.
    """

    supports_batch = True

    def __init__(self, model: PreTrainedModel | CachedLM, fallback_threshold: float = 0.0):
        super().__init__()
        self.fallback_threshold = check_number("fallback threshold alpha_FB", fallback_threshold, 0.0, 1.0)
        # a CachedLM or any other backend as it is; HF models wrapped in a CachedLM (from_options picks the lean
        # backend where it applies: backends/lean_draft.py)
        self.lm = cached_model(model, "draft")
        self.discard: torch.Tensor | None = None  # batches: rows whose drafts another drafter replaced (see commit)
        self._fed: torch.Tensor | None = None  # batches: each row's committed tokens when the last draft began

    @classmethod
    def from_options(cls, target: CachedLM, options) -> "ModelDrafter":
        if options.draft_model is None:
            raise DraftVerifyError(f"the {cls.name!r} drafter needs a draft model: pass draft=... (CLI: --draft PATH)")
        if options.draft_tokenizer is not None:  # a draft with another vocabulary: its text is re-tokenized
            from .cross_tokenizer import CrossTokenizerDrafter

            return CrossTokenizerDrafter.from_options(target, options)
        draft = draft_backend(options.draft_model, "draft", options.compile, options.lean_draft)  # LeanLM or CachedLM
        return cls(draft, fallback_threshold=options.alpha_fb)

    def bind(self, target: CachedLM, max_positions: int) -> None:
        self.check_pair(self.lm, target, max_positions)

    @staticmethod
    def check_pair(draft: CachedLM, target: CachedLM, max_positions: int) -> None:
        """A draft model must share the target's vocabulary and kind, and fit the request's positions."""
        if draft.vocab_size != target.vocab_size:
            raise DraftVerifyError(
                f"draft and target have different vocabularies ({draft.vocab_size} vs {target.vocab_size} "
                "output logits); speculative decoding needs a draft trained with the target's tokenizer"
            )
        if draft.is_encoder_decoder != target.is_encoder_decoder:
            kinds = {True: "encoder-decoder", False: "decoder-only"}
            raise DraftVerifyError(
                f"the draft is {kinds[draft.is_encoder_decoder]} but the target is {kinds[target.is_encoder_decoder]}; "
                "use a draft of the same kind"
            )
        draft.check_fits(max_positions)

    def start(self, state: DecodingState, prefilled=None) -> None:
        if self.lm.is_encoder_decoder:
            self.lm.start(state.source_ids)
            return
        width = state.tokens.shape[1]  # the same left-padded rows as the target's
        mask = torch.arange(width, device=state.tokens.device)[None] >= (width - state.lengths)[:, None]  # [B, L]
        self.lm.start(state.tokens, attention_mask=mask if state.padded else None)

    def unseen(self, state: DecodingState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the draft model feeds first this step: each row's committed tokens its cache has not seen,
        right-aligned ([B, width]; rows needing fewer are padded, new_valid [B, width] marks the real ones, None
        when none is padded). Starts the step's bookkeeping that commit() reads (the rows' lengths now)."""
        need = state.lengths - self.lm.row_length.to(state.lengths.device)  # [B] >= 1
        width = int(need.max())
        pending = state.tokens[:, -width:]  # [B, width]
        new_valid = None
        if bool((need < width).any()):
            new_valid = torch.arange(width, device=pending.device)[None] >= (width - need)[:, None]  # [B, width]
        self._fed = state.lengths.clone()
        self.discard = None
        return pending, new_valid

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        params = state.params
        pending, new_valid = self.unseen(state)
        tokens: list[torch.Tensor] = []
        q: list[torch.Tensor] = []
        stop = state.draft_confidence
        greedy = isinstance(params, SamplingParams) and params.greedy
        drafting = lengths = None  # the confidence stop: rows still drafting [B], tokens per row [B]
        for i in range(gamma):
            logits = self.lm.forward(pending, new_valid=new_valid).logits[:, -1]  # [B, V]
            new_valid = None
            self.forward_calls += 1
            q_i = probs_from_logits(logits, params)  # [B, V]
            top_q, argmax = q_i.max(dim=-1)  # [B], [B]: max q (the stop rules read it) and, greedy, the token
            if self.fallback_threshold > 0 and float(top_q.max()) <= self.fallback_threshold:
                break
            x = argmax if greedy else draw_next(q_i, state, i)  # [B]
            tokens.append(x)
            q.append(q_i)
            pending = x[:, None]
            if stop > 0:  # the draft ends at its first unconfident token, that token included (ConfidenceGamma)
                confident = top_q > stop  # [B]
                if drafting is None:
                    drafting, lengths = torch.ones_like(confident), torch.zeros_like(x)
                lengths += drafting
                drafting &= confident
                if not bool(drafting.any()):  # the batch's forward goes on while any row is still drafting
                    break
        draft = stack_draft(tokens, q, state)
        if lengths is not None and bool((lengths < draft.length).any()):
            draft.lengths = lengths
        return draft

    def commit(self, state: DecodingState, verdict: Verdict, scored=None) -> None:
        # the tail holds the committed tokens fed this step and the drafts fed after them; only the accepted drafts
        # stay valid, and each row's last committed token is pending
        upto = torch.minimum(self.lm.row_length, (state.lengths - 1).to(self.lm.row_length.device))  # [B]
        if self.discard is not None:  # these rows committed someone else's draft: ours are not their text
            upto = torch.where(self.discard.to(upto.device), torch.minimum(upto, self._fed.to(upto.device)), upto)
            self.discard = None
        self.lm.truncate_rows(upto)

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.lm.drop_rows(keep)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.lm.join_rows(input_ids, attention_mask)
