"""EAGLE-3 with EAGLE-2's dynamic draft tree (Li et al. 2024): the head expands a token tree level by level and
the tree's shape follows the head's own confidence instead of a fixed list of paths.

A node's value is its path's draft probability, the product of the head's probabilities along it (EAGLE-2 finds it a
good estimate of the chance the target accepts the path). Each level, the k nodes of highest value are forwarded
through the head together (one head forward per level, each node seeing the committed pairs and its own ancestors
in the tree), and each gets its top-k tokens as children. Then all nodes are reranked by value and the best N are
verified: a child's value never exceeds its parent's, so the best N always form a tree. With a length policy
that measures costs (gamma `auto`, `conf`) N is the prefix of that ranking with the best expected tokens per
second on this backend (tree_sizing.py); with a fixed gamma, the whole budget of --eagle3-nodes.

The candidates are deterministic given the context (q_probs None: tree sampling treats them as fixed candidates),
so greedy and sampling stay exact through the tree verifiers. The drafted nodes' keys and values are cut from the
head's cache when the verdict arrives (Eagle3Drafter.commit); the accepted branch comes back as pairs built from
the verify pass's features at its kept tree positions.
"""

from __future__ import annotations

from functools import lru_cache
from time import perf_counter

import torch

from ..backends.base import LMBackend
from ..errors import DraftVerifyError, OptionValueError
from ..sampling import probs_from_logits
from ..tree import TreeSpec
from ..tree_sizing import best_subtree
from ..types import DecodingState, Draft
from .base import empty_draft
from .eagle3 import Eagle3Drafter
from .eagle3_head import Eagle3Head


def positive(name: str, flag: str, value) -> int:
    """A tree option's value, refused in one line unless it is a whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionValueError(f"eagle3_tree needs {flag} (API: {name}) to be a whole number >= 1, got {value!r}")
    return value


@lru_cache(maxsize=1024)
def tree_of(parents: tuple[int, ...]) -> TreeSpec:
    """The TreeSpec of a shape, built once per shape (bounded: a dynamic tree takes many shapes over a run)."""
    return TreeSpec.from_parents(list(parents))


class Pool:
    """Every node the head has proposed this step, in the order they were made (a parent before its children):
    token, parent (-1: the root, the pending token), log value (the path's log draft probability) and depth."""

    def __init__(self) -> None:
        self.tokens: list[torch.Tensor] = []  # [c] per batch of children
        self.parents: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.depth: list[int] = []

    @property
    def size(self) -> int:
        return len(self.depth)

    def add(self, tokens: torch.Tensor, parents: torch.Tensor, values: torch.Tensor, depth: int) -> torch.Tensor:
        """Children tokens, parents and values [c]; returns their node indices [c]."""
        first = self.size
        self.tokens.append(tokens)
        self.parents.append(parents)
        self.values.append(values)
        self.depth += [depth] * tokens.numel()
        return torch.arange(first, self.size)

    def flat(self) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """tokens [P], parents as a host list [P], values on the host [P]."""
        return torch.cat(self.tokens), torch.cat(self.parents).tolist(), torch.cat(self.values).float().cpu()


class Eagle3TreeDrafter(Eagle3Drafter):
    """Drafts EAGLE-2's dynamic tree with the EAGLE-3 head: top_k children per expanded node and top_k nodes
    expanded per level, at most `nodes` nodes verified; gamma caps the depth. With the length policy's confidence
    stop the tree also ends at the first level none of whose parents is confident (as model_tree does)."""

    proposes_trees = True
    supports_batch = False  # one row: the tree's shape is the row's own

    def __init__(self, head: Eagle3Head, top_k: int = 4, nodes: int = 16):
        super().__init__(head)
        self.top_k = positive("eagle3_top_k", "--eagle3-topk", top_k)
        self.nodes = positive("eagle3_nodes", "--eagle3-nodes", nodes)
        self.level_seconds: float | None = None  # mean seconds of one head forward (a tree level)
        self._sized_steps = 0

    def start(self, state: DecodingState, prefilled=None) -> None:
        if state.tokens.shape[0] != 1:
            raise DraftVerifyError("eagle3_tree drafts for one row at a time; send the requests one by one")
        super().start(state, prefilled)

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "Eagle3TreeDrafter":
        positive("eagle3_top_k", "--eagle3-topk", options.eagle3_top_k)  # before the head loads
        positive("eagle3_nodes", "--eagle3-nodes", options.eagle3_nodes)
        return cls(cls.load_head(options), options.eagle3_top_k, options.eagle3_nodes)

    def verify_width(self, longest: int) -> int:
        k = self.top_k
        return min(self.nodes, k + max(longest - 1, 0) * k * k) + 1  # the budget, or every node a tree that deep has

    @torch.no_grad()
    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._features is None:  # a one-token prompt: no features yet, the first step drafts nothing
            return empty_draft(state)
        started, calls = perf_counter(), self.forward_calls
        prenorm, end = self.catch_up(state)  # [1, 1, H] the root's state, [1] the pending token's position
        pool = self.expand(state, prenorm, int(end[0]), gamma)
        tokens, parents, values = pool.flat()
        chosen = self.choose(state, parents, values, pool.depth)
        index = {j: i for i, j in enumerate(chosen)}
        tree = tree_of(tuple(index[parents[j]] if parents[j] >= 0 else -1 for j in chosen))
        if tokens.device.type == "cuda":  # the clock must cover the device's work (the verify waits on it anyway)
            torch.cuda.synchronize(tokens.device)
        self._time_levels(perf_counter() - started, self.forward_calls - calls)
        return Draft(tokens=tokens[chosen][None], tree=tree)  # tokens [1, N]

    def expand(self, state: DecodingState, root: torch.Tensor, end: int, gamma: int) -> Pool:
        """The head's tree, level by level down to depth gamma: level d's best top_k nodes (by value) are forwarded
        at position end + d - 1, each seeing the committed pairs and its forwarded ancestors, and get their top_k
        tokens as children."""
        assert self.embed is not None  # set by bind
        head, k, device = self.head, self.top_k, root.device
        pool = Pool()
        log_q = self.log_probs(root[0], state)  # [1, V] the root's distribution
        states = root[0]  # [m, H] the prenorm states of the level's parents (the root first)
        parents = [-1]  # [m] those parents
        values = log_q.new_zeros(1)  # [m] their log values
        past, real = self.cache.length, self._real[0].cpu()  # [P] the committed pairs' columns
        forwarded: list[int] = []  # nodes whose keys and values the head's cache holds after them, in order
        ancestors: dict[int, list[int]] = {-1: []}  # node -> its forwarded ancestors and itself
        for depth in range(1, gamma + 1):
            best = log_q.topk(min(k, log_q.shape[-1]), dim=-1)  # [m, c] each parent's children
            children = best.indices.shape[1]
            level_values = (values[:, None] + best.values).flatten()  # [m * c]
            level_parents = torch.tensor(parents).repeat_interleave(children)  # [m * c]
            level = pool.add(best.indices.flatten(), level_parents, level_values, depth)
            if depth == gamma or (state.draft_confidence > 0 and float(log_q.amax().exp()) <= state.draft_confidence):
                break  # the level's nodes are kept, none is forwarded
            pick = level_values.topk(min(k, level.numel())).indices.sort().values  # [m] the level's best, in order
            nodes = level[pick.cpu()].tolist()
            for node, parent in zip(nodes, level_parents[pick.cpu()].tolist()):
                ancestors[node] = ancestors[parent] + [node]
            mask = torch.zeros(len(nodes), past + len(forwarded) + len(nodes), dtype=torch.bool)  # [m, cache + m]
            mask[:, :past] = real
            forwarded += nodes
            column = {node: past + i for i, node in enumerate(forwarded)}
            for row, node in enumerate(nodes):
                mask[row, [column[a] for a in ancestors[node]]] = True
            slot = [p // children for p in pick.tolist()]  # each picked node's parent's row in `states`
            tokens = best.indices.flatten()[pick][None]  # [1, m]
            positions = torch.full((1, len(nodes)), end + depth - 1, device=device)
            states = head.step(self.cache, self.embed(tokens), states[slot][None], positions, mask.to(device))[0]
            self.forward_calls += 1
            log_q = self.log_probs(states, state)  # [m, V]
            parents, values = nodes, level_values[pick]
        return pool

    def log_probs(self, prenorm: torch.Tensor, state: DecodingState) -> torch.Tensor:
        """prenorm [m, H] -> the head's log q [m, V], as the sampling settings shape it (untempered when greedy)."""
        assert self.lm_head is not None  # set by bind
        return probs_from_logits(self.head.logits(prenorm, self.lm_head), state.params).log()

    def choose(self, state: DecodingState, parents: list[int], values: torch.Tensor, depth: list[int]) -> list[int]:
        """The nodes to verify (ascending): the best `nodes` by value (ties to the earlier node, so a parent comes
        before its children), or the prefix of them sized by measured costs when the policy measures them."""
        possible = int(torch.isfinite(values).sum())  # a token the sampling filter removed is never worth a slot
        ranked = torch.sort(-values, stable=True).indices[: max(1, min(self.nodes, possible))].tolist()
        costs = state.costs
        if costs is None or not costs.known or self.level_seconds is None:
            return sorted(ranked)
        self._sized_steps += 1
        if not costs.slope_known and self._sized_steps % 2:  # time a narrow call too: the chain of best children
            chain, node = [], -1
            for j in ranked:
                if parents[j] == node:
                    chain.append(j)
                    node = j
            return chain
        # the head has drafted its levels already: every subtree pays them, what is chosen is the verify width
        levels = max(depth[j] for j in ranked)
        return best_subtree(
            values.exp().tolist(), [levels] * len(depth), self.level_seconds, costs.target_seconds, allowed=ranked
        )

    def _time_levels(self, seconds: float, forwards: int) -> None:
        """A running mean of one head forward's seconds: the tree's cost per level."""
        per = seconds / forwards
        self.level_seconds = per if self.level_seconds is None else 0.9 * self.level_seconds + 0.1 * per
