"""How many nodes of a draft tree to verify: the subtree that maximises expected tokens per second, from how often
each node ends up on the accepted branch and from the measured cost of scoring n tokens on this backend.

A node's chance of being accepted never exceeds its parent's (a child is only judged when its parent was kept), so
the nodes in order of that chance, ties to the lower index, form a valid subtree at every prefix: sizing is picking
the best prefix length k. Its expected tokens are 1 + the sum of the first k chances (the target's own token plus
the accepted drafts), its cost is one draft forward per level (the root's included) plus a target call over
k + 1 tokens. On a GPU scoring 16 tokens costs about what scoring one does, and the whole tree pays; on a CPU the
cost grows with the tokens (a forward over more tokens is more compute), and the unlikely side branches do not pay.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .tree import TreeSpec


class NodeRates:
    """Per node of a full tree: how often it was on the accepted branch of the steps that proposed it. A node not
    yet proposed counts half its parent's rate (weight `prior` steps), so an unmeasured branch is neither dropped
    for good nor trusted."""

    def __init__(self, tree: TreeSpec, prior: float = 2.0):
        self.parents = tree.parents.tolist()
        self.depth = tree.depth.tolist()
        self.prior = prior
        self.hits = [0.0] * tree.size
        self.trials = [0.0] * tree.size

    def record(self, proposed: Sequence[int], accepted: Sequence[int]) -> None:
        """One row of one step: the full-tree nodes it proposed, and those on its accepted branch."""
        for j in proposed:
            self.trials[j] += 1
        for j in accepted:
            self.hits[j] += 1

    def rates(self) -> list[float]:
        """[N] each node's chance of being accepted, never above its parent's (topological order)."""
        out: list[float] = []
        for j, parent in enumerate(self.parents):
            above = 1.0 if parent < 0 else out[parent]
            guess = 0.5 * above
            rate = (self.hits[j] + self.prior * guess) / (self.trials[j] + self.prior)
            out.append(min(rate, above))
        return out


def best_subtree(
    rates: Sequence[float],
    depth: Sequence[int],
    level_seconds: float,
    verify_seconds: Callable[[int], float],
    rows: int = 1,
    allowed: Sequence[int] | None = None,
) -> list[int]:
    """The nodes (indices into the full tree, ascending) of the prefix of nodes by acceptance rate whose expected
    tokens per second is highest. level_seconds: one draft forward; verify_seconds(n): a target call scoring n
    tokens (rows x (k + 1) for a batch); allowed: the nodes that may be kept (e.g. within a depth cap)."""
    candidates = range(len(rates)) if allowed is None else allowed
    order = sorted(candidates, key=lambda j: (-rates[j], j))
    best_speed, best_k = float("-inf"), 1
    tokens, levels = 1.0, 0
    for k, j in enumerate(order, start=1):
        tokens += rates[j]
        levels = max(levels, depth[j])
        speed = tokens / (levels * level_seconds + verify_seconds(rows * (k + 1)))
        if speed > best_speed:
            best_speed, best_k = speed, k
    return sorted(order[:best_k])
