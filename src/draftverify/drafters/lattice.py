"""The top-k sausage lattice of blockwise heads and its global n-gram rescoring (paper sections 6.3 and 7.2).

Slot j of the lattice holds head (j + 2)'s k most likely tokens with their log-probabilities; any choice of one
token per slot is a draft (k^D of them). n-gram rescoring picks the p best paths under

    score(path) = sum_j [ log q_j(x_j) + alpha * log S_ngram(x_j | context, x_<j) ]

exactly, by a k-best Viterbi over (slot, n-gram state): the future of a path depends only on its last n - 1
tokens, so the p best paths through any state extend only the p best prefixes that reach it; cost
poly(k, D) = D * k^(n-1) states * k successors * p. The paper composes weighted FSTs with OpenFST; for one
sausage and a table already in memory this DP is the same search without a dependency (pynini and kenlm are not
installed here, and the shipped table is our own safetensors format).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import OptionValueError
from .ngram import NgramTable


@dataclass
class SausageLattice:
    tokens: torch.Tensor  # [D, k] long, slot j's candidates, best first
    logprobs: torch.Tensor  # [D, k] float, the heads' log-probabilities of those candidates

    @classmethod
    def top_k(cls, head_logits: torch.Tensor, k: int) -> "SausageLattice":
        """head_logits [D, V] (heads 2..D+1 at one position) -> the top-k lattice."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise OptionValueError(f"the lattice needs k >= 1 candidates per head, got {k!r}")
        logprobs = head_logits.float().log_softmax(dim=-1)
        top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        return cls(tokens=top.indices, logprobs=top.values)

    @property
    def depth(self) -> int:
        return self.tokens.shape[0]

    def oracle_length(self, truth: list[int]) -> int:
        """How many leading true tokens the lattice can spell: the accepted length of the best path in hindsight."""
        length = 0
        for j, token in enumerate(truth[: self.depth]):
            if token not in self.tokens[j].tolist():
                break
            length = j + 1
        return length


def kbest_paths(
    lattice: SausageLattice, table: NgramTable | None, context: list[int], alpha: float, p: int
) -> list[list[int]]:
    """The p highest-scoring paths (best first) of the lattice under head log-prob + alpha * n-gram score.

    context: the committed tokens (the n-gram's history for the first slot). table None or alpha 0 is
    "p-best 0-gram": the heads' own scores, which for p = 1 is plain BPD's draft.
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise OptionValueError(f"p-best rescoring needs p >= 1 paths, got {p!r}")
    history = 0 if table is None or alpha == 0 else table.order - 1
    tokens = lattice.tokens.tolist()
    head = lattice.logprobs.double().cpu().numpy()  # [D, k]

    def lm_scores(state: tuple[int, ...], j: int) -> np.ndarray:
        """alpha * log S(candidate | state) for slot j's candidates [k]."""
        if history == 0:
            return np.zeros(len(tokens[j]))
        return alpha * table.backoff_logprobs(list(state), tokens[j])

    start = tuple(context[len(context) - history :]) if history else ()
    beams: dict[tuple[int, ...], list[tuple[float, tuple[int, ...]]]] = {start: [(0.0, ())]}  # state -> p best
    for j in range(lattice.depth):
        grown: dict[tuple[int, ...], list[tuple[float, tuple[int, ...]]]] = {}
        for state, paths in beams.items():
            step = head[j] + lm_scores(state, j)  # [k]
            for c, token in enumerate(tokens[j]):
                nxt = (state + (token,))[-history:] if history else ()
                bucket = grown.setdefault(nxt, [])
                for score, path in paths:
                    bucket.append((score + step[c], path + (token,)))
        beams = {state: heapq.nlargest(p, paths) for state, paths in grown.items()}
    finals = heapq.nlargest(p, (item for paths in beams.values() for item in paths))
    return [list(path) for _, path in finals]
