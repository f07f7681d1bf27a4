"""A small Hugging Face LM drafts autoregressively with its own KV cache (Leviathan M_q; BiLD small model)."""

from __future__ import annotations

import torch
from torch import nn

from ..backends.base import LMBackend, takes_host_ids
from ..backends.lean_draft import draft_backend
from ..backends.registry import as_backend
from ..errors import DraftVerifyError, check_number
from ..sampling import draw_next
from ..types import DecodingState, Draft, Verdict
from .base import Drafter, DraftModel, empty_draft
from .draft_positions import DraftForwards, PositionNeeds, StagedForwards, position_needs
from .draft_stops import DraftStops


def require_shared_vocabulary(options, drafter: str) -> None:
    """Drafters that read the draft model's logits over the target's vocabulary refuse a draft with its own."""
    if options.draft_tokenizer is not None:
        raise DraftVerifyError(
            f"the draft model has its own tokenizer, but the {drafter!r} drafter reads its probabilities over the "
            "target's vocabulary; use --method model (or cross_tokenizer) with it, or a draft trained with the "
            "target's tokenizer"
        )


class ModelDrafter(Drafter):
    """Drafts gamma tokens and returns their probabilities q (filtered exactly like the target's p).

    fallback_threshold is BiLD's alpha_FB: drafting stops before the first token whose max q is not above
    alpha_FB (Algorithm 1, line 4: small model's token only if max p_S > alpha_FB; section 3.3's prose says
    "< alpha_FB", the two differ only at equality), handing that position to the target. With the algorithm's
    form 0 never falls back and 1 always does, even when a float softmax rounds to exactly 1.

    The length policy's confidence stop (DecodingState.draft_confidence, gamma `conf`) is the same test used as a
    draft length: the draft ends *at* (not before) its first token whose max q is <= the threshold; in a batch it
    ends when every row has reached such a token, and every row keeps the batch's length: a row's own stop would
    save no draft forward (the batch's goes on for the others) and, on a backend that scores rows densely (or in
    micro-batches of equal counts, as llama.cpp does), little or nothing of the verify pass, while the tokens it
    drafts past that stop are its own draws from q and are sometimes right. With
    staged drafting (one row), a token that prompt lookup proposes too counts as confident whatever its max q: two
    drafters that agree are right far more often than the draft's q says (options: lookup_confirms). The stop
    still reads only the committed text and the draft, so every exact verifier stays exact.
    """

    supports_batch = True

    def __init__(
        self,
        model: LMBackend | nn.Module,
        fallback_threshold: float = 0.0,
        lookup_tokens: int = 0,
        lookup_ngrams: tuple[int, int] = (3, 2),
        lookup_confirms: bool = True,
    ):
        super().__init__()
        self.fallback_threshold = check_number("fallback threshold alpha_FB", fallback_threshold, 0.0, 1.0)
        if isinstance(lookup_tokens, bool) or not isinstance(lookup_tokens, int) or lookup_tokens < 0:
            raise DraftVerifyError(
                f"lookup_tokens (--lookup-tokens) must be a whole number >= 0, got {lookup_tokens!r}"
            )
        self.lookup_tokens = lookup_tokens  # staged drafting (draft_positions.py StagedForwards); 0: off
        self.lookup_ngrams = lookup_ngrams  # longest and shortest n-gram the lookup matches
        self.lookup_confirms = lookup_confirms  # staged drafting: a token lookup proposes too counts as confident
        # a backend as it is; HF models on the hf backend (from_options picks the lean backend where it applies:
        # backends/lean_draft.py)
        self.lm = as_backend(model, "draft")
        self.discard: torch.Tensor | None = None  # batches: rows whose drafts another drafter replaced (see commit)
        self.stages = False  # staged drafting this request: lookup_tokens > 0, one decoder-only row, no rows joined
        self._fed: torch.Tensor | None = None  # batches: each row's committed tokens when the last draft began
        self._fed_text = 0  # one row (stages): its committed tokens when the last draft began

    @classmethod
    def from_options(cls, target: LMBackend, options) -> Drafter:
        if options.draft_model is None:
            raise DraftVerifyError(f"the {cls.name!r} drafter needs a draft model: pass draft=... (CLI: --draft PATH)")
        if options.draft_tokenizer is not None:  # a draft with another vocabulary: its text is re-tokenized
            from .cross_tokenizer import CrossTokenizerDrafter

            return CrossTokenizerDrafter.from_options(target, options)
        draft = draft_backend(options.draft_model, "draft", options.compile, options.lean_draft)  # LeanLM or CachedLM
        # staged drafting on a growing cache (a compiled draft keeps fixed widths)
        return cls(
            draft,
            fallback_threshold=options.alpha_fb,
            lookup_tokens=0 if options.compile else options.lookup_tokens,
            lookup_ngrams=(options.prompt_lookup_max_ngram, options.lookup_model_min_ngram),
            lookup_confirms=options.lookup_confirms,
        )

    def bind(self, target: LMBackend, max_positions: int) -> None:
        self.check_pair(self.lm, target, max_positions)

    def models(self) -> list[DraftModel]:
        return [DraftModel(self.lm)]

    @staticmethod
    def check_pair(draft: LMBackend, target: LMBackend, max_positions: int) -> None:
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
        self.stages = (
            self.lookup_tokens > 0
            and not self.lm.is_encoder_decoder
            and state.tokens.shape[0] == 1
            and not state.padded
        )
        if self.lm.is_encoder_decoder:
            self.lm.start(state.source_ids)
            return
        width = state.tokens.shape[1]  # the same left-padded rows as the target's
        mask = torch.arange(width, device=state.tokens.device)[None] >= (width - state.lengths)[:, None]  # [B, L]
        self.lm.start(state.tokens, attention_mask=mask if state.padded else None)

    def unseen(self, state: DecodingState) -> tuple[torch.Tensor | list[list[int]], torch.Tensor | None]:
        """What the draft model feeds first this step: each row's committed tokens its cache has not seen,
        right-aligned ([B, width]; rows needing fewer are padded, new_valid [B, width] marks the real ones, None
        when none is padded). Starts the step's bookkeeping that commit() reads (the rows' lengths now). One
        unpadded row: Python ints, a tensor only for a draft model that takes one (after a llama.cpp forward each
        small tensor op is dear)."""
        self.discard = None
        if self.stages:
            text = state.row_ids(0)
            self._fed_text = len(text)
            fed = [text[self.lm.length :]]
            return (fed if takes_host_ids(self.lm) else torch.tensor(fed, device=state.device)), None
        self._fed = state.lengths.clone()
        need = state.lengths - self.lm.row_length.to(state.lengths.device)  # [B] >= 1
        width = int(need.max())
        pending = state.tokens[:, -width:]  # [B, width]
        new_valid = None
        if bool((need < width).any()):
            new_valid = torch.arange(width, device=pending.device)[None] >= (width - need)[:, None]  # [B, width]
        return pending, new_valid

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        """Up to gamma draft tokens [B, N] and their q [B, N, V]: at each position the draft's distribution q
        (from forwards() : one forward per token, or staged), BiLD's fallback may end the draft before the
        token, then the token is drawn from q (its argmax when greedy) and the confidence stop may end the draft
        at it (draft_stops.py)."""
        needs = position_needs(state.params, self.fallback_threshold, state.draft_confidence)
        forwards = self.forwards(state, needs)
        stops = DraftStops(self.fallback_threshold, state.draft_confidence, self.lookup_confirms)
        picked: list[list[int]] = []  # greedy: each position's tokens, as Python ints [N][B]
        drawn: list[torch.Tensor] = []  # sampling: each position's tokens [B]
        q: list[torch.Tensor | None] = []  # each position's q [B, V] (None: a greedy draft, one-hot)
        while len(q) < gamma:
            position = forwards.next(gamma - len(q))
            if stops.falls_back(position):
                break
            if position.greedy is not None:
                picked.append(position.greedy)
                first = position.greedy[0]
                forwards.took(position.greedy, first)
            else:
                assert position.q is not None  # sampling always reads q (PositionNeeds.q)
                token = draw_next(position.q, state, len(q))  # [B]
                drawn.append(token)
                first = int(token[0])
                forwards.took(token, first)
            q.append(position.q)
            if stops.ends_at(position, first):
                break
        forwards.finish()
        if not q:
            return empty_draft(state)
        # [B, N, V]; None where a greedy draft's positions came without q (read through NumPy: draft_positions.py)
        q_probs = None if any(p is None for p in q) else torch.stack(q, dim=1)  # type: ignore[arg-type]
        if picked:  # one tensor from the host ints, which the verify pass reads again (Draft.rows)
            draft = Draft.of_rows([list(row) for row in zip(*picked)], state.device)
            draft.q_probs = q_probs
            return draft
        return Draft(tokens=torch.stack(drawn, dim=1), q_probs=q_probs)  # [B, N], [B, N, V]

    def forwards(self, state: DecodingState, needs: PositionNeeds) -> DraftForwards:
        """Where this step's positions come from: staged drafting on one row when on (lookup_tokens), else one
        forward per draft token."""
        if self.stages:
            return StagedForwards(self, state, needs, self.lookup_tokens, self.lookup_ngrams)
        return DraftForwards(self, state, needs)

    def commit(self, state: DecodingState, verdict: Verdict, scored=None) -> None:
        # the tail holds the committed tokens fed this step and the drafts fed after them; only the accepted drafts
        # stay valid, and each row's last committed token is pending
        if self.stages:  # one unpadded row: plain ints
            upto = min(self.lm.length, len(state.row_ids(0)) - 1)
            if self.discard is not None and bool(self.discard[0]):
                upto = min(upto, self._fed_text)
            self.discard = None
            self.lm.commit(upto - self.lm.committed)
            return
        upto = torch.minimum(self.lm.row_length, (state.lengths - 1).to(self.lm.row_length.device))  # [B]
        if self.discard is not None and self._fed is not None:  # these rows committed another drafter's draft
            upto = torch.where(self.discard.to(upto.device), torch.minimum(upto, self._fed.to(upto.device)), upto)
            self.discard = None
        self.lm.truncate_rows(upto)

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.lm.drop_rows(keep)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.stages = False
        self.lm.join_rows(input_ids, attention_mask)
