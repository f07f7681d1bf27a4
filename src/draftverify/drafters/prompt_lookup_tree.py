"""Prompt lookup with several matches at once: the continuations of the latest earlier occurrences of the
context's final n-gram, merged into a trie and verified together as one token tree.

A single match is a guess between equally plausible copies (the same line head continues differently in
different places); scoring them all in one target forward keeps the longest one the target agrees with.
Model-free and deterministic (q one-hot), like its chain twin.
"""

from __future__ import annotations

from ..errors import DraftVerifyError, OptionValueError
from ..tree import row_trees
from ..types import DecodingState, Draft
from .base import Drafter, empty_draft
from .prompt_lookup import match_starts


def find_continuations(haystack: list[int], max_ngram: int, min_ngram: int, gamma: int, limit: int) -> list[list[int]]:
    """The pattern is the haystack's last n tokens. Up to `limit` distinct continuations (each up to gamma tokens)
    following earlier occurrences, longest n first, latest occurrence first within an n."""
    found: list[list[int]] = []
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(haystack) <= n:
            continue
        for start in match_starts(haystack, n):
            continuation = haystack[start + n : start + n + gamma]
            if continuation not in found:
                found.append(continuation)
            if len(found) == limit:
                return found
    return found


def trie(continuations: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token lists into a trie: (tokens [N], parents [N]) in insertion (topological) order."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for continuation in continuations:
        parent = -1
        for token in continuation:
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = node
    return tokens, parents


class PromptLookupTreeDrafter(Drafter):
    """For encoder-decoder targets the source would be searched too, but trees need position ids, so this drafter
    serves decoder-only targets."""

    proposes_trees = True
    supports_batch = True  # each row its own trie, on one tree shape (tree.row_trees)
    computes_in_torch = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_matches: int = 4):
        super().__init__()
        if not (1 <= min_ngram <= max_ngram):
            raise OptionValueError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got min={min_ngram}, max={max_ngram}"
            )
        if isinstance(num_matches, bool) or not isinstance(num_matches, int) or num_matches < 1:
            raise OptionValueError(f"prompt_lookup_tree needs num_matches >= 1, got {num_matches!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_matches = num_matches

    @classmethod
    def from_options(cls, target, options) -> "PromptLookupTreeDrafter":
        return cls(options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram, options.prompt_lookup_matches)

    def bind(self, target, max_positions: int) -> None:
        if not target.takes_positions:
            raise DraftVerifyError(
                "prompt_lookup_tree needs a decoder-only target that takes position_ids; use prompt_lookup instead"
            )

    def verify_width(self, longest: int) -> int:
        return longest * self.num_matches + 1  # the matches merged into one tree, each as long

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        rows = [
            trie(find_continuations(state.row_ids(b), self.max_ngram, self.min_ngram, gamma, self.num_matches))
            for b in range(state.tokens.shape[0])
        ]
        if not any(tokens for tokens, _ in rows):
            return empty_draft(state)
        tree, tokens, valid = row_trees(rows, state.tokens.device)
        return Draft(tokens=tokens, tree=tree, valid=valid)
