"""A draft model with its own tokenizer drafts for any target (Hugging Face's "universal assisted generation").

Each step, lazily at the proposal: the target's newly committed tokens extend the committed text (as bytes,
retokenize.TokenBytes); the draft's ids for that text are brought up to date by encoding again only a window of
`window` draft tokens at the boundary with the new text (the settled ids stay, and so does the draft's KV cache
for them); the draft model drafts greedily in its own vocabulary; its text is encoded into target tokens after
the committed ones (retokenize.to_target), and the last of those is dropped, because the draft's text was cut at
an arbitrary point and its last target token may be the start of a longer one ("retu" of "return").

Why it stays exact: the proposal is a function of the text, a deterministic proposal (q one-hot at each token:
Draft.q_probs None, as prompt lookup's). Speculative sampling then keeps x with probability p(x) and otherwise
samples from norm(max(0, p - onehot(x))) = p with x removed, so the emitted token is distributed as p whatever x
is; greedy verification emits the target's argmax; Gumbel coupling emits the target's own draw. The draft
drafts greedily at every temperature: with a one-hot q a token is kept with probability p(x), highest for the
target's likeliest token, which the draft's likeliest token approximates.

The draft never drafts (the target decodes alone, as exactly as ever) while the committed text ends inside a
UTF-8 character, once it holds bytes that are not UTF-8 or that the draft's tokenizer does not spell back, and
once the draft's context is full.
"""

from __future__ import annotations

from math import ceil
from time import perf_counter

import torch

from ..backends.registry import as_backend
from ..errors import DraftVerifyError
from ..types import DecodingState, Draft
from .base import Drafter, DraftModel, empty_draft
from .retokenize import TokenBytes, TokenTrack, common_prefix, complete_prefix, to_target

WINDOW = 4  # draft tokens encoded again at the boundary with new text (a token straddling it is re-merged)
LOOKBEHIND = 4  # committed target tokens encoded together with the draft's text (see retokenize.to_target)


class CrossTokenizerDrafter(Drafter):
    """Drafts with any causal LM and its own tokenizer; proposals are target tokens with a one-hot q.

    GenerationStats.time_retokenize (through timers()) is the time spent moving text between the tokenizers,
    part of time_draft."""

    def __init__(
        self,
        model,
        draft_tokenizer,
        target_tokenizer,
        target_vocab_size: int | None = None,
        window: int = WINDOW,
        lookbehind: int = LOOKBEHIND,
    ):
        super().__init__()
        self.lm = as_backend(model, "draft")
        if not callable(getattr(self.lm, "rollback", None)):  # CachedLM and the lean draft backend can roll back
            raise DraftVerifyError(
                f"a draft with its own tokenizer runs on the hf backend (transformers), not on "
                f"{self.lm.name}: use --backend hf"
            )
        if self.lm.is_encoder_decoder:
            raise DraftVerifyError(
                "the draft is an encoder-decoder model; a draft with its own tokenizer must be a "
                "decoder-only (causal) LM"
            )
        if window < 1 or lookbehind < 0:
            raise DraftVerifyError(f"window must be >= 1 and lookbehind >= 0, got {window} and {lookbehind}")
        self.window, self.lookbehind = window, lookbehind
        self.draft = TokenBytes(draft_tokenizer, self.lm.vocab_size, "draft")
        self.target_tokenizer = target_tokenizer
        self.target = TokenBytes(target_tokenizer, target_vocab_size or len(target_tokenizer), "target")
        self.prefix = self.draft.special_prefix()  # the draft's BOS, if its tokenizer puts one first
        self.draft_eos = {i for i in _ids(getattr(draft_tokenizer, "eos_token_id", None))}
        self.target_eos = getattr(target_tokenizer, "eos_token_id", None)
        self.time_retokenize = 0.0
        self._reset()

    @classmethod
    def from_options(cls, target, options) -> "CrossTokenizerDrafter":
        if options.draft_model is None:
            raise DraftVerifyError(f"the {cls.name!r} drafter needs a draft model: pass draft=... (CLI: --draft PATH)")
        if options.target_tokenizer is None:
            raise DraftVerifyError(
                f"the {cls.name!r} drafter needs the target's tokenizer: set "
                "MethodOptions.target_tokenizer (load() and Pipeline set it)"
            )
        if options.alpha_fb > 0:
            raise DraftVerifyError(
                "BiLD's fallback (alpha_fb) reads the draft's probabilities over the target's "
                "vocabulary; a draft with its own tokenizer has none: use --alpha-fb 0, or a draft "
                "trained with the target's tokenizer"
            )
        draft_tokenizer = options.draft_tokenizer or options.target_tokenizer  # None: the draft shares the target's
        return cls(
            as_backend(options.draft_model, "draft", options.compile),
            draft_tokenizer,
            options.target_tokenizer,
            target.vocab_size,
        )

    def bind(self, target, max_positions: int) -> None:
        if target.is_encoder_decoder:
            raise DraftVerifyError(
                "a draft with its own tokenizer continues the target's text; the target is an "
                "encoder-decoder model, which does not continue its source"
            )
        if target.vocab_size != len(self.target.table):
            self.target = TokenBytes(self.target_tokenizer, target.vocab_size, "target")

    def models(self) -> list[DraftModel]:
        return [DraftModel(self.lm)]

    def timers(self) -> dict[str, float]:
        return {"retokenize": self.time_retokenize}

    def _reset(self) -> None:
        self.text = bytearray()  # the committed text: the bytes of the target's committed tokens
        self.seen = 0  # target tokens whose bytes are in self.text
        self.track = TokenTrack()  # the draft's ids: the committed text as last synced, then its last draft
        self.track.append(self.prefix, self.draft)
        self.spelled = bytearray()  # the bytes self.track spells
        self.agreed = 0  # bytes of self.spelled known to equal self.text
        self.started = False  # the draft's cache is filled at the first proposal
        self.stalled = False  # text the draft cannot take: no more drafts in this generation

    def start(self, state: DecodingState, prefilled=None) -> None:
        if state.tokens.shape[0] != 1:
            raise DraftVerifyError("a draft with its own tokenizer drafts for one row at a time")
        self._reset()

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        began = perf_counter()
        cut = self._sync(state)
        self.time_retokenize += perf_counter() - began
        if cut is None or not self._sync_cache(cut):
            return empty_draft(state)
        drafted, proposal = self._draft_tokens(state, gamma)
        began = perf_counter()
        proposal = proposal[:gamma]
        self.track.append(drafted, self.draft)
        self.spelled += self.draft.bytes_of(drafted)
        self.time_retokenize += perf_counter() - began
        if not proposal:
            return empty_draft(state)
        return Draft(tokens=torch.tensor([proposal], dtype=torch.long, device=state.tokens.device))  # [1, N]

    def _sync(self, state: DecodingState) -> int | None:
        """Bring the committed text and the draft's ids up to date; returns how many of the draft's old ids were
        kept, or None when no draft can be made."""
        row = state.tokens[0]  # [L]
        if row.shape[0] > self.seen:
            self.text += self.target.bytes_of(row[self.seen :].tolist())
            self.seen = row.shape[0]
        if self.stalled or complete_prefix(self.text) < len(self.text):  # a character split across target tokens
            return None
        agree = common_prefix(self.spelled, self.text, min(self.agreed, len(self.spelled)))
        keep = max(self.track.within(agree), len(self.prefix))
        cut = max(len(self.prefix), keep - self.window)
        while (
            cut > len(self.prefix)
            and self.track.start_of(cut) < len(self.text)
            and self.text[self.track.start_of(cut)] & 0xC0 == 0x80
        ):  # never start a window inside a character
            cut -= 1
        start = self.track.start_of(cut)
        try:
            window = self.text[start:].decode("utf-8")
        except UnicodeDecodeError:
            self.stalled = True
            return None
        ids = self.draft.encode(window)  # the boundary window, re-tokenized
        self.track.cut(cut)
        self.track.append(ids, self.draft)
        del self.spelled[start:]
        self.spelled += self.draft.bytes_of(ids)
        if self.spelled[start:] != self.text[start:]:  # the draft's tokenizer normalised it: offsets would not line up
            self.stalled = True
            return None
        self.agreed = len(self.text)
        return cut

    def _sync_cache(self, kept: int) -> bool:
        """The draft's cache holds a prefix of its ids (the first `kept` at most); False when it cannot draft."""
        if len(self.track) >= (self.lm.max_positions or float("inf")) or not self.track.ids:
            return False
        if not self.started:
            self.lm.start(torch.tensor([self.track.ids], device=self.lm.device))  # prefills all but the last
            self.started = True
        else:
            self.lm.rollback(min(self.lm.length, kept, len(self.track) - 1))
        return True

    def _draft_tokens(self, state: DecodingState, gamma: int) -> tuple[list[int], list[int]]:
        """Greedy draft tokens in the draft's vocabulary, enough for gamma target tokens after the last one is
        dropped, and those target tokens (the proposal). Leaves the last draft token unfed."""
        pending = self.track.ids[self.lm.length :]  # [k >= 1] ids the draft's cache does not hold yet
        per_token = len(self.track) / max(1, self.seen)  # draft tokens per target token, on the committed text
        need = max(1, ceil((gamma + 1) * per_token))
        room = (self.lm.max_positions or float("inf")) - len(self.track)
        limit = int(min(2 * need + 4, room))
        stop = state.draft_confidence
        drafted: list[int] = []
        proposal: list[int] | None = None  # the target tokens of `drafted`, when converted at its present length
        complete = unsure = False
        for _ in range(limit):
            fed = torch.tensor([pending], device=self.lm.device)
            logits = self.lm.forward(fed, logits_to_keep=1).logits[0, -1]  # [V_draft]
            self.forward_calls += 1
            x = int(logits.argmax())
            if not self.draft.spells[x]:  # a special token or a padding row: the draft's text ends here
                complete, proposal = x in self.draft_eos, None
                break
            drafted.append(x)
            proposal = None
            if stop > 0 and float(logits.float().softmax(dim=-1).max()) <= stop:  # unconfident: ends the draft
                unsure = True
                break
            if len(drafted) >= need:
                began = perf_counter()
                proposal = self._to_target(drafted, False, state)
                self.time_retokenize += perf_counter() - began
                if len(proposal) >= gamma:
                    break
            pending = [x]
        if proposal is None:
            began = perf_counter()
            proposal = self._to_target(drafted, complete, state, keep_last=unsure)
            self.time_retokenize += perf_counter() - began
        return drafted, proposal

    def _to_target(
        self, drafted: list[int], complete: bool, state: DecodingState, keep_last: bool = False
    ) -> list[int]:
        """The target tokens of the drafted text after the committed ones; the last one is dropped unless the
        draft ended its text (then the target's end-of-text token follows) or keep_last: a draft ended by the
        confidence stop keeps it, as the model drafter keeps its unconfident token: dropping it would shorten
        every such draft by one more token than the stop already does."""
        data = self.draft.bytes_of(drafted)
        whole = complete_prefix(data)
        try:
            text = data[:whole].decode("utf-8")
        except UnicodeDecodeError:
            return []
        tail = state.tokens[0, -self.lookbehind :].tolist() if self.lookbehind else []
        spells = self.target.spells
        silent = [n for n, i in enumerate(tail) if not (0 <= i < len(spells) and spells[i])]
        tail = tail[silent[-1] + 1 :] if silent else tail  # only tokens that spell text (a BOS is not part of it)
        ids = to_target(tail, text, self.target) if text else []
        if complete and whole == len(data):
            ids = ids + ([self.target_eos] if self.target_eos is not None else [])
        elif not keep_last:
            ids = ids[:-1]
        vocab = len(self.target.table)
        for n, i in enumerate(ids):
            if not 0 <= i < vocab:
                return ids[:n]
        return ids


def _ids(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
