"""Copy drafter (Leviathan section 4; Hugging Face "prompt lookup"): continue the latest earlier match of the
context's final n-gram. Model-free, so its cost c is ~0; its proposals are deterministic (q one-hot)."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import OptionValueError
from ..types import DecodingState, Draft
from .base import Drafter, empty_draft


def match_starts(haystack: list[int], n: int) -> Iterator[int]:
    """Where each earlier occurrence of the haystack's last n tokens starts (one with a token after it), latest
    first. On Python lists: one scan shared by the chain and tree lookups, with no tensor ops per draft forward."""
    pattern = haystack[-n:]
    first = pattern[0]
    for i in range(len(haystack) - n - 1, -1, -1):
        if haystack[i] == first and haystack[i : i + n] == pattern:
            yield i


def find_continuation(haystack: list[int], max_ngram: int, min_ngram: int, gamma: int) -> list[int]:
    """The pattern is the haystack's last n tokens. Returns up to gamma tokens following its latest earlier
    occurrence, trying the longest n first; [] if nothing matches."""
    return find_match(haystack, max_ngram, min_ngram, gamma)[0]


def find_match(haystack: list[int], max_ngram: int, min_ngram: int, gamma: int) -> tuple[list[int], int]:
    """find_continuation's tokens and the n of the n-gram that matched (0 when none did)."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(haystack) > n:
            for start in match_starts(haystack, n):
                return haystack[start + n : start + n + gamma], n
    return [], 0


class PromptLookupDrafter(Drafter):
    """For encoder-decoder targets the source is searched too (copying from the input, as in summarization)."""

    supports_batch = True
    computes_in_torch = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        super().__init__()
        if not (1 <= min_ngram <= max_ngram):
            raise OptionValueError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got min={min_ngram}, max={max_ngram}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def from_options(cls, target, options) -> "PromptLookupDrafter":
        return cls(options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram)

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        return ragged_draft([self.find(state, b, gamma)[0] for b in range(state.batch_size)], state)

    def find(self, state: DecodingState, b: int, gamma: int) -> tuple[list[int], int]:
        """Row b's draft as host ints: the continuation of its latest matching n-gram (up to gamma tokens), and
        that n (0: no match)."""
        haystack = state.row_ids(b)
        if state.source_ids is not None:
            haystack = state.source_ids[b].tolist() + haystack
        return find_match(haystack, self.max_ngram, self.min_ngram, gamma)


def ragged_draft(rows: list[list[int]], state: DecodingState) -> Draft:
    """Per-row drafts of host ints, of different lengths n_b -> one Draft padded to the longest, with lengths [B]
    when they differ (the verifiers judge no position past a row's own length); no draft at all when every row
    found none. One tensor op, and the step reads the rows back without another (Draft.rows)."""
    longest = max(len(r) for r in rows)
    if longest == 0:
        return empty_draft(state)
    return Draft.of_rows(rows, state.device)
