"""A bounded suffix index over token sequences (the `suffix` drafter's cache, SuffixDecoding-style): for every
context of min_match..max_match tokens that occurs in the indexed sequences, how often each token followed it.

This is a suffix trie cut at depth max_match + 1, stored by node (context -> next-token counts) in one hash map
instead of as linked nodes: finding the longest suffix of a context that occurs is at most
max_match - min_match + 1 look-ups, and a draft walks on by re-matching the context with its own tokens appended,
so a continuation may run longer than the trie is deep. A suffix tree or automaton would hold longer matches in less
memory, but neither lets whole sequences leave cheaply; here a sequence leaves by decrementing the counts it added.

Memory is bounded by whole sequences: when the indexed tokens exceed max_tokens, the least recently written
finished sequences leave first (a live one, still being decoded, stays until it finishes). Not thread-safe: one
decoding loop (the server's one worker thread) writes and reads it.
"""

from __future__ import annotations

from collections import OrderedDict

from .errors import DraftVerifyError


class Node:
    """One context's continuations: next token -> count, in the order of their latest write (ties go to the
    latest), and their total."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0

    def add(self, token: int) -> None:
        self.counts[token] = self.counts.pop(token, 0) + 1  # re-inserted: the dict's order is recency
        self.total += 1

    def remove(self, token: int) -> None:
        left = self.counts[token] - 1
        if left:
            self.counts[token] = left
        else:
            del self.counts[token]
        self.total -= 1

    def best(self) -> tuple[int, int]:
        """(token, count) of the most frequent continuation, the latest written among equals."""
        token, top = -1, 0
        for t, c in self.counts.items():
            if c >= top:
                token, top = t, c
        return token, top


class SuffixIndex:
    def __init__(self, min_match: int = 1, max_match: int = 8, max_tokens: int = 16384):
        if not (1 <= min_match <= max_match):
            raise DraftVerifyError(f"the suffix index needs 1 <= min_match <= max_match, got {min_match}, {max_match}")
        if max_tokens < 1:
            raise DraftVerifyError(f"the suffix index needs max_tokens >= 1, got {max_tokens}")
        self.min_match = min_match
        self.max_match = max_match
        self.max_tokens = max_tokens
        self.nodes: dict[tuple[int, ...], Node] = {}
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()  # least recently written first
        self.live: set[int] = set()
        self.tokens = 0
        self._next_id = 0

    def add(self, tokens: list[int]) -> int:
        """Index a new live sequence; returns its id (for extend and finish)."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = []
        self.live.add(seq_id)
        self.extend(seq_id, tokens)
        return seq_id

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        """Append tokens to a live sequence: each becomes a continuation of the contexts that end before it."""
        seq = self.sequences[seq_id]
        self.sequences.move_to_end(seq_id)
        lo, hi = self.min_match, self.max_match
        for token in tokens:
            i = len(seq)
            for k in range(lo, min(hi, i) + 1):
                context = tuple(seq[i - k : i])
                node = self.nodes.get(context)
                if node is None:
                    node = self.nodes[context] = Node()
                node.add(token)
            seq.append(token)
        self.tokens += len(tokens)
        self._evict()

    def finish(self, seq_id: int) -> None:
        """The sequence is complete: it stays as history and may now leave when the index is over its bound."""
        self.live.discard(seq_id)
        self._evict()

    def clear(self) -> None:
        self.nodes.clear()
        self.sequences.clear()
        self.live.clear()
        self.tokens = 0

    def _evict(self) -> None:
        while self.tokens > self.max_tokens:
            victim = next((s for s in self.sequences if s not in self.live), None)
            if victim is None:
                return
            self._remove(victim)

    def _remove(self, seq_id: int) -> None:
        seq = self.sequences.pop(seq_id)
        lo, hi = self.min_match, self.max_match
        for i, token in enumerate(seq):
            for k in range(lo, min(hi, i) + 1):
                context = tuple(seq[i - k : i])
                node = self.nodes[context]
                node.remove(token)
                if not node.total:
                    del self.nodes[context]
        self.tokens -= len(seq)

    def match(self, context: list[int]) -> Node | None:
        """The continuations of the longest suffix of context (at most max_match tokens) seen in the index."""
        for k in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            node = self.nodes.get(tuple(context[len(context) - k :]))
            if node is not None:
                return node
        return None

    def continuation(self, context: list[int], limit: int, min_prob: float) -> list[int]:
        """Up to `limit` tokens after context, each the most frequent continuation of the longest matched suffix
        (the drafted tokens join the context). Stops before the token at which the product of the frequencies
        (count / total at each step: the draft's estimated chance to be kept whole) would fall below min_prob."""
        return self.continuation_with_odds(context, limit, min_prob)[0]

    def continuation_with_odds(self, context: list[int], limit: int, min_prob: float) -> tuple[list[int], list[float]]:
        """continuation's tokens and each one's frequency in its matched node (count / total): the index's own
        estimate that the token follows, given the ones before it."""
        out: list[int] = []
        odds: list[float] = []
        context = list(context[-self.max_match :])
        prob = 1.0
        while len(out) < limit:
            node = self.match(context)
            if node is None:
                break
            token, count = node.best()
            prob *= count / node.total
            if prob < min_prob:
                break
            out.append(token)
            odds.append(count / node.total)
            context = (context + [token])[-self.max_match :]
        return out, odds
