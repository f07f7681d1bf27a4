"""A small draft LM expands a token tree: each node's children are the draft's top-k tokens after it
(SpecInfer's expansion-based token tree; Medusa's tree shape given as a list of paths).

The draft scores one tree level per forward with the same ancestor-mask machinery the target uses, in its own
backend, so a tree of depth D costs D draft forwards whatever its width. With a length policy that measures
costs (gamma `auto`, `conf`) each step verifies the subtree of the given shape with the best expected tokens per
second on this backend (tree_sizing.py); with a fixed gamma the whole shape, cut at depth gamma.
"""

from __future__ import annotations

from time import perf_counter
from typing import Sequence

import torch
from torch import nn

from ..backends.base import LMBackend
from ..backends.registry import as_backend
from ..errors import DraftVerifyError
from ..sampling import probs_from_logits
from ..tree import TreeSpec
from ..tree_sizing import NodeRates, best_subtree
from ..types import DecodingState, Draft, Verdict
from .base import Drafter, DraftModel
from .draft_options import draft_model_backend
from .model import ModelDrafter

# 3 candidates at the root, 2 under the best, a chain along the best branch: 10 nodes, depth 4
DEFAULT_TREE_PATHS: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (0, 0),
    (0, 1),
    (1, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
    (0, 0, 0, 0),
)
EXPLORE_EVERY = 8  # every 8th sized step verifies the whole shape, so the rates of dropped nodes stay measured


class ModelTreeDrafter(Drafter):
    """Proposes the tree's nodes as top-k candidates (deterministic: q_probs None, so tree sampling treats them
    as fixed candidates). gamma caps the depth: the tree keeps its paths of length <= gamma. With the length
    policy's confidence stop (gamma `conf`) the tree also ends at the first level none of whose parents is
    confident (max q <= the threshold), as a chain draft ends at its first unconfident token."""

    proposes_trees = True
    supports_batch = True  # one tree shape for every row, each row its own tokens

    def __init__(self, model: LMBackend | nn.Module, paths: Sequence[Sequence[int]] = DEFAULT_TREE_PATHS):
        super().__init__()
        self.lm = as_backend(model, "draft")  # a backend as it is; HF models on the hf backend
        self.paths = [tuple(p) for p in paths]
        self.full_tree = TreeSpec.from_paths(self.paths)
        self._depth = self.full_tree.depth.tolist()
        ranks, parents = self.full_tree.ranks.tolist(), self.full_tree.parents.tolist()
        self._main: list[int] = []  # the chain of first candidates (rank 0 all the way down)
        for j in range(self.full_tree.size):
            if ranks[j] == 0 and (parents[j] < 0 or parents[j] in self._main):
                self._main.append(j)
        self._trees: dict[tuple[int, ...], TreeSpec] = {}
        self.rates = NodeRates(self.full_tree)  # how often each node of the shape is accepted (this drafter's runs)
        self.level_seconds: float | None = None  # mean seconds of one draft forward (a tree level)
        self._sized_steps = 0
        # what commit() needs to know about the last proposal (host ints: no device sync)
        self._tree: TreeSpec | None = None  # None: nothing proposed since the last commit (a plain step)
        self._nodes: list[int] = []  # the proposed tree's nodes as indices into full_tree
        self._pending = 0  # committed tokens the draft fed first

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "ModelTreeDrafter":
        draft = draft_model_backend(options, cls.name)
        return cls(draft, options.tree_paths if options.tree_paths is not None else DEFAULT_TREE_PATHS)

    def bind(self, target: LMBackend, max_positions: int) -> None:
        ModelDrafter.check_pair(self.lm, target, max_positions)
        if not (self.lm.takes_positions and target.takes_positions):
            raise DraftVerifyError(
                "model_tree needs decoder-only draft and target models that take position_ids; "
                "use the chain method 'model' for encoder-decoder models"
            )

    def models(self) -> list[DraftModel]:
        return [DraftModel(self.lm)]

    def verify_width(self, longest: int) -> int:
        return self.full_tree.size + 1  # the whole shape, whatever the draft length

    def start(self, state: DecodingState, prefilled=None) -> None:
        width = state.tokens.shape[1]  # the same left-padded rows as the target's
        mask = torch.arange(width, device=state.tokens.device)[None] >= (width - state.lengths)[:, None]  # [B, L]
        self.lm.start(state.tokens, attention_mask=mask if state.padded else None)

    def subtree(self, nodes: list[int]) -> TreeSpec:
        """The TreeSpec of these nodes of the full shape (ascending indices, every parent included)."""
        key = tuple(nodes)
        if key not in self._trees:
            parents = self.full_tree.parents.tolist()
            index = {j: i for i, j in enumerate(nodes)}
            self._trees[key] = (
                self.full_tree
                if len(nodes) == self.full_tree.size
                else TreeSpec.from_parents([index[parents[j]] if parents[j] >= 0 else -1 for j in nodes])
            )
        return self._trees[key]

    def nodes_for(self, state: DecodingState, gamma: int) -> list[int]:
        """This step's nodes: the shape cut at depth gamma, sized by measured costs when the policy measures them."""
        allowed = [j for j, d in enumerate(self._depth) if d <= gamma]
        costs = state.costs
        if costs is None or not costs.known or self.level_seconds is None:
            return allowed
        self._sized_steps += 1
        if not costs.slope_known:  # every call so far scored one width: time the main chain too, every other step
            return [j for j in self._main if j in allowed] if self._sized_steps % 2 else allowed
        if self._sized_steps % EXPLORE_EVERY == 0:
            return allowed
        return best_subtree(
            self.rates.rates(),
            self._depth,
            self.level_seconds,
            costs.target_seconds,
            rows=state.tokens.shape[0],
            allowed=allowed,
        )

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        started = perf_counter()
        self._nodes = self.nodes_for(state, gamma)
        tree = self._tree = self.subtree(self._nodes)
        self._lengths_before = state.lengths.clone()
        self._held_before = self.lm.row_length.to(state.lengths.device)  # [B] positions the draft held
        need = state.lengths - self._held_before  # [B] >= 1 committed tokens each row's draft has not seen
        width = int(need.max())
        pending = state.tokens[:, -width:]  # [B, width] right-aligned, rows needing fewer are padded
        new_valid = None
        if bool((need < width).any()):
            new_valid = torch.arange(width, device=pending.device)[None] >= (width - need)[:, None]
        self._pending = width
        root_logits = self.lm.forward(pending, new_valid=new_valid, logits_to_keep=1).logits[:, -1]  # [B, V]
        self.forward_calls += 1
        forwards = 1
        batch = pending.shape[0]
        ranks = self.full_tree.ranks[self._nodes]  # [N] each node's candidate rank in the full shape (a subtree may
        width = int(ranks.max()) + 1  # keep a third child without the second)
        tokens = pending.new_zeros((batch, tree.size))  # [B, N]
        parent_logits = root_logits[:, None]  # [B, 1, V] outputs of the previous level's nodes (root first)
        parent_slot = torch.zeros(tree.size, dtype=torch.long)  # where each node's parent sits in parent_logits
        base = self.lm.length - 1  # position of the last pending token (the tree's root)
        for depth in range(1, tree.max_depth + 1):
            nodes = (tree.depth == depth).nonzero().flatten()  # [n_d] this level's node indices
            candidates = parent_logits.topk(min(width, parent_logits.shape[-1]), dim=-1).indices  # [B, m, width]
            tokens[:, nodes] = candidates[:, parent_slot[nodes], ranks[nodes]]
            if depth == tree.max_depth:
                break
            if state.draft_confidence > 0 and self._unconfident(parent_logits, state):
                self._nodes = [j for j in self._nodes if self._depth[j] <= depth]
                tree = self._tree = self.subtree(self._nodes)  # the nodes of depth <= this level come first
                tokens = tokens[:, : tree.size]
                break
            mask = self._level_mask(tree, nodes, pending.shape[1])  # [n_d, tail + n_d]
            positions = base + tree.depth[nodes][None]  # [1, n_d]
            parent_logits = self.lm.forward(tokens[:, nodes], positions, mask).logits  # [B, n_d, V]
            self.forward_calls += 1
            forwards += 1
            slot_of = torch.full((tree.size,), -1, dtype=torch.long)
            slot_of[nodes] = torch.arange(nodes.numel())
            parent_slot = torch.where(tree.parents >= 0, slot_of[tree.parents.clamp(min=0)], parent_slot)
        if tokens.device.type == "cuda":  # the clock must cover the device's work (the verify waits on it anyway)
            torch.cuda.synchronize(tokens.device)
        self._time_levels(perf_counter() - started, forwards)
        return Draft(tokens=tokens, tree=tree)

    def _time_levels(self, seconds: float, forwards: int) -> None:
        """A running mean of one draft forward's seconds: the tree's cost per level."""
        per = seconds / forwards
        self.level_seconds = per if self.level_seconds is None else 0.9 * self.level_seconds + 0.1 * per

    @staticmethod
    def _unconfident(parent_logits: torch.Tensor, state: DecodingState) -> bool:
        """The length policy's confidence stop for a tree: the tree ends at the first level where no parent's
        distribution has a max q above the threshold (that level's nodes are kept; their forward is saved)."""
        return float(probs_from_logits(parent_logits, state.params).amax(dim=-1).max()) <= state.draft_confidence

    @staticmethod
    def _level_mask(tree: TreeSpec, nodes: torch.Tensor, pending: int) -> torch.Tensor:
        """bool [n_d, tail + n_d]: a level's nodes see the pending tokens, the earlier levels' ancestors and
        themselves. The tail is the pending tokens then every node forwarded so far (nodes 0..nodes[-1])."""
        forwarded = int(nodes[-1]) + 1  # nodes are in depth order, so earlier levels are exactly the lower indices
        mask = torch.zeros(nodes.numel(), pending + forwarded, dtype=torch.bool)
        mask[:, :pending] = True
        mask[:, pending:] = tree.ancestor_mask[nodes][:, :forwarded]
        return mask

    def commit(self, state: DecodingState, verdict: Verdict, scored=None) -> None:
        """Each row keeps its fed tokens and the forwarded prefix of its accepted branch (the deepest level is
        never forwarded), up to its committed tokens but the last. Levels are forwarded in node order, so node j
        sits at tail offset `pending width` + j; a row's fed tokens are the last of the pending slots (padding
        first). After a plain step (gamma 0: no proposal) the draft model fed nothing; the next proposal catches
        up."""
        if self._tree is None:
            return
        emitted = (state.lengths - self._lengths_before).tolist()  # [B] tokens each row committed this step
        need = (self._lengths_before - self._held_before).tolist()
        room = (state.lengths - 1 - self._held_before).tolist()  # positions a row may hold beyond what it held
        path = verdict.path.tolist()
        kept = verdict.num_accepted.tolist()
        rows = []
        for b in range(len(emitted)):
            self.rates.record(self._nodes, [self._nodes[j] for j in path[b][: kept[b]]])
            forwarded = min(max(0, emitted[b] - 1), self._tree.max_depth - 1)
            fed = list(range(self._pending - need[b], self._pending))
            rows.append((fed + [self._pending + j for j in path[b][:forwarded]])[: room[b]])
        longest = max(len(r) for r in rows)
        offsets = torch.tensor([r + [-1] * (longest - len(r)) for r in rows], dtype=torch.long)
        self.lm.commit(offsets)
        self._tree = None

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.lm.drop_rows(keep)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.lm.join_rows(input_ids, attention_mask)
