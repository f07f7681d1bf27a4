"""Suffix drafter (SuffixDecoding, Oliaro et al. 2024; vLLM's `suffix` method, llama.cpp's ngram cache shared
across slots): match the longest suffix of the context in an index of this request's text and of earlier
requests' prompts and outputs, then draft the most frequent continuation while its estimated chance stays above a
threshold. Prompt lookup copies from this prompt only; agentic and repetitive traffic repeats earlier answers,
which this reuses.

The index (suffix_index.py) lives as long as the drafter: one per loaded pipeline, so one per server process
(every request's rows read it and write their text into it, whatever batch they run in) and one per Python
Pipeline / CLI run, fed by each generate call. A row's text enters as it is committed, so its own repetitions are
found as prompt lookup finds them; when the row finishes its text stays as history (bounded, oldest out first).

Exact by construction: the proposal is a function of the committed text and the history, never of the random
stream, so its q is one-hot (Draft.q_probs None) and the lossless verifiers keep the target's distribution."""

from __future__ import annotations

import torch

from ..backends.base import LMBackend, dear_width
from ..draft_length import MAX_GAMMA
from ..errors import OptionValueError
from ..suffix_index import SuffixIndex
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter
from .prompt_lookup import ragged_draft

# (min_match, max_match) not given: where a wider verify pass costs little (hf), draft after short matches; where it
# grows dear with its width (llama.cpp), draft only after long ones, as llama.cpp's ngram-mod (24 tokens), so the
# drafts come seldom and are nearly always kept. There the drafts may run as long as the cost model finds they pay,
# up to the engine's widest draft (Drafter.longest_draft; llama.cpp's ngram-mod drafts 48 to 64 tokens): each
# position costs nothing to draft, and the continuation ends itself where its estimate falls below min_prob
MATCH = (1, 8)
MATCH_DEAR_WIDTH = (24, 24)


def match_lengths(target: LMBackend, min_match: int | None, max_match: int | None) -> tuple[int, int]:
    """The (min_match, max_match) a suffix drafter runs with on this target: the given ones, the missing ones from
    the target's defaults (and never crossing a given one)."""
    low, high = MATCH_DEAR_WIDTH if dear_width(target) else MATCH
    if min_match is None:
        min_match = low if max_match is None else max(1, min(low, max_match))  # below 1 is the given one's fault
    if max_match is None:
        max_match = max(high, min_match)
    return min_match, max_match


class SuffixDrafter(Drafter):
    supports_batch = True
    computes_in_torch = False

    def __init__(
        self,
        max_match: int = MATCH[1],
        min_match: int = MATCH[0],
        cache_tokens: int = 16384,
        min_prob: float = 0.1,
        longest_draft: int | None = None,
    ):
        super().__init__()
        if not (1 <= min_match <= max_match):
            raise OptionValueError(
                "the suffix drafter needs 1 <= --suffix-min-match <= --suffix-max-match (API: suffix_min_match, "
                f"suffix_max_match), got {min_match} and {max_match}"
            )
        if cache_tokens < 1:
            raise OptionValueError(f"--suffix-cache-tokens (API: suffix_cache_tokens) must be >= 1, got {cache_tokens}")
        if not (0.0 <= min_prob <= 1.0):
            raise OptionValueError(f"--suffix-min-prob (API: suffix_min_prob) must be between 0 and 1, got {min_prob}")
        self.max_match = max_match
        self.min_match = min_match
        self.cache_tokens = cache_tokens
        self.min_prob = min_prob
        self.longest_draft = longest_draft  # None: the length policy's own bound
        self.index = SuffixIndex(min_match, max_match, cache_tokens)
        self._rows: list[int] = []  # each batch row's sequence id in the index
        self._seen: list[int] = []  # each row's decoder tokens already indexed

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "SuffixDrafter":
        min_match, max_match = match_lengths(target, options.suffix_min_match, options.suffix_max_match)
        longest = MAX_GAMMA if dear_width(target) else None
        return cls(max_match, min_match, options.suffix_cache_tokens, options.suffix_min_prob, longest)

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self._finish(range(len(self._rows)))  # an earlier generation's rows (its last rows never left) are history
        self._rows, self._seen = [], []
        for b in range(state.batch_size):
            source = state.source_ids[b].tolist() if state.source_ids is not None else []
            text = state.row_ids(b)
            self._rows.append(self.index.add(source + text))
            self._seen.append(len(text))

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        for b in range(state.batch_size):
            text = state.row_ids(b)
            if len(text) > self._seen[b]:
                self.index.extend(self._rows[b], text[self._seen[b] :])
                self._seen[b] = len(text)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        rows = []
        for b in range(state.batch_size):
            text = state.row_ids(b)
            rows.append(self.index.continuation(text[-self.max_match :], gamma, self.min_prob))
        return ragged_draft(rows, state)

    def drop_rows(self, keep: torch.Tensor) -> None:
        kept = keep.tolist()
        self._finish(b for b, k in enumerate(kept) if not k)
        self._rows = [r for r, k in zip(self._rows, kept) if k]
        self._seen = [s for s, k in zip(self._seen, kept) if k]

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            real = [t for t, m in zip(ids, mask) if m]
            self._rows.append(self.index.add(real))
            self._seen.append(len(real))

    def forget(self) -> None:
        self.index.clear()
        self._rows, self._seen = [], []

    def _finish(self, rows) -> None:
        for b in rows:
            self.index.finish(self._rows[b])
