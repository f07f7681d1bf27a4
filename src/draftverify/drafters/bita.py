"""BiTA drafting (Lin et al. 2024): the frozen target drafts for itself in its own verify pass, through learned
mask tokens (and a prompt only they see; drafters/bita_adapter.py).

One forward per step scores the pending token, the candidate tree and groups of M mask tokens. The verifier walks
the tree (greedy, or lossless tree sampling: candidates are deterministic, so q is one-hot at each); the mask
group attached to the last kept position predicts the M tokens after the next pending token, and their top-k form
the next step's candidates. The cache keeps only the accepted path: mask positions are never committed.

Decoding modes (the paper's Table 4):
- `bita_chain`, straightforward: one mask group after the pending token, seeing only the committed text (not the
  draft); the next draft is its top-1 predictions not yet overtaken by accepted tokens (M - accepted of them).
- `bita_tree`, full tree: every combination of the top-k of each mask (k + k^2 + ... + k^M nodes), a mask group
  attached to the pending token and to every node.
- `bita`, the efficient tree: top-k per level, only the top-1 candidate continues deeper (k * M nodes), a mask
  group per node; the paper's choice.
"""

from __future__ import annotations

from itertools import product

import torch

from ..backends.base import LMBackend, require_modules
from ..errors import DraftVerifyError, OptionValueError
from ..tree import TreeSpec
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, empty_draft
from .bita_adapter import BitaAdapter
from .extra_positions import ExtraPositionsTarget, VerifyExtras


def efficient_tree(k: int, depth: int) -> TreeSpec:
    """Level i holds the top-k of mask i; only each level's top-1 has children (the paper's Figure 5)."""
    return TreeSpec.from_paths([(0,) * level + (rank,) for level in range(depth) for rank in range(k)])


def full_tree(k: int, depth: int) -> TreeSpec:
    """Every root-to-leaf combination of the top-k of each mask: k + k^2 + ... + k^depth nodes."""
    return TreeSpec.from_paths([p for level in range(1, depth + 1) for p in product(range(k), repeat=level)])


def mask_groups(
    tree: TreeSpec | None, draft_length: int, attach: list[int], num_masks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layout of mask groups in a verify pass over the pending token, N = draft_length draft nodes and the groups.

    attach[g] is the node group g hangs after (-1 = the pending token). Mask i of group g sees the pending token,
    that node and its ancestors, and masks 0..i of its own group (never the draft of a chain: attach [-1] there),
    at position offset depth(node) + 1 + i. Returns positions [G*M] and mask [G*M, 1+N+G*M] (bool).
    """
    m, n = num_masks, draft_length
    width = 1 + n + len(attach) * m
    mask = torch.zeros(len(attach) * m, width, dtype=torch.bool)
    mask[:, 0] = True
    depth = torch.zeros(len(attach), dtype=torch.long)
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    for g, node in enumerate(attach):
        rows = slice(g * m, (g + 1) * m)
        if node >= 0:
            mask[rows, 1 : 1 + n] = tree.ancestor_mask[node]
            depth[g] = tree.depth[node]
        mask[rows, 1 + n + g * m : 1 + n + (g + 1) * m] = causal
    positions = (depth[:, None] + 1 + torch.arange(m)[None]).flatten()
    return positions, mask


class BitaDrafter(Drafter):
    """Straightforward (chain) BiTA; the tree modes below differ in which tree they build and where masks hang."""

    needs_target_modules = "extra embedded positions and a per-layer prefix in the target's verify pass"
    needs_target_hidden = True  # commit() reads the mask tokens' logits from the verify pass
    drafts_in_target_pass = True
    proposes_trees = False
    supports_batch = True  # every row's mask groups sit where its own kept tokens end

    def __init__(self, adapter: BitaAdapter, topk: int = 1, num_masks: int | None = None):
        super().__init__()
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise OptionValueError(f"bita needs top-k >= 1 candidates per mask token, got {topk!r}")
        trained = adapter.config.num_masks
        if num_masks is not None and (
            isinstance(num_masks, bool) or not isinstance(num_masks, int) or not 1 <= num_masks <= trained
        ):
            raise OptionValueError(f"bita can use 1..{trained} of this adapter's mask tokens, got {num_masks!r}")
        self.adapter = adapter.eval()
        # the first m masks of a group see only each other, so fewer than trained keep their meaning
        self.num_masks = num_masks or trained
        self.topk = topk
        self._embeds: torch.Tensor | None = None  # [M, H] in the target's dtype
        self._prefix = None
        self._mask_logits: torch.Tensor | None = None  # [B, M, V] of the group after the last kept position
        self._ahead: torch.Tensor | None = None  # chain: [B] the first mask still ahead of each row's pending token
        self._layouts: dict = {}

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "BitaDrafter":
        if options.bita_path is None:
            raise DraftVerifyError("bita needs a trained adapter: pass bita_path=... (CLI: --bita DIR)")
        if options.compile:
            raise DraftVerifyError(
                "bita appends learned embeddings to the target's verify pass, which the compiled "
                "target does not take: run it without --compile"
            )
        return cls(BitaAdapter.load(options.bita_path), options.bita_topk, options.bita_masks)

    def wrap_target(self, target: LMBackend) -> LMBackend:
        """The target with this adapter's mask groups (and deep prompt) appended to every verify pass."""
        model = require_modules(target, "bita").module()
        if target.is_encoder_decoder or not target.takes_positions:
            raise DraftVerifyError(
                "bita places mask tokens at chosen positions of a decoder-only target that takes position_ids; "
                f"{type(model).__name__} does not"
            )
        wrapped = ExtraPositionsTarget(target, self._extras, "bita")
        self.adapter.check_target(model)
        self.adapter.to(target.device)
        with torch.no_grad():
            self._embeds = self.adapter.mask_embeds[: self.num_masks].to(target.dtype)
            prefix = self.adapter.prefix(model)
        self._prefix = None if prefix is None else tuple((k.to(target.dtype), v.to(target.dtype)) for k, v in prefix)
        return wrapped

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self._mask_logits = None  # the first verify pass drafts nothing; its mask group gives the first candidates
        self._ahead = None

    def drop_rows(self, keep: torch.Tensor) -> None:
        if self._mask_logits is not None:
            self._mask_logits = self._mask_logits[keep.to(self._mask_logits.device)]
            self._ahead = None if self._ahead is None else self._ahead[keep.to(self._ahead.device)]

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Rows that join have no mask group yet: their candidates are all-zero logits this once (whatever they
        propose, the verifier keeps only the target's tokens; a chain row proposes nothing)."""
        if self._mask_logits is not None:
            fresh = self._mask_logits.new_zeros((input_ids.shape[0],) + tuple(self._mask_logits.shape[1:]))
            self._mask_logits = torch.cat([self._mask_logits, fresh])
            if self._ahead is not None:
                self._ahead = torch.cat([self._ahead, self._ahead.new_full((input_ids.shape[0],), self.num_masks)])

    def _layout(self, tree: TreeSpec | None, length: int, attach: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(tree), length, len(attach))
        if key not in self._layouts:
            self._layouts[key] = mask_groups(tree, length, attach, self.num_masks)
        return self._layouts[key]

    def _groups(self, tree: bool, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask-group layout of a verify pass over a chain of `length` drafts: one group after the pending token."""
        return self._layout(None, length, [-1])

    def _extras(self, tree: bool, length: int, batch: int) -> VerifyExtras:
        """The mask groups of a verify pass over a tree (True) or a chain of `length` drafts, for `batch` rows."""
        positions, mask = self._groups(tree, length)
        groups = positions.shape[0] // self.num_masks
        embeds = self._embeds.repeat(groups, 1)[None].expand(batch, -1, -1)  # [B, G*M, H]
        return VerifyExtras(embeds=embeds, positions=positions, mask=mask, prefix=self._prefix)

    # ---- straightforward decoding
    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._mask_logits is None:
            return empty_draft(state)
        tokens = self._mask_logits.argmax(dim=-1)  # [B, M]
        masks = tokens.shape[1]
        lengths = (masks - self._ahead).clamp(max=gamma)  # [B] each row's masks still ahead of its pending token
        width = int(lengths.max())
        if width == 0:
            return empty_draft(state)
        index = (self._ahead[:, None] + torch.arange(width, device=tokens.device)[None]).clamp(max=masks - 1)
        draft = Draft(tokens=tokens.gather(1, index))  # [B, width]
        if bool((lengths < width).any()):
            draft.lengths = lengths
        return draft

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        # scored: each row's kept positions right-aligned in 1 + max n columns, then the one mask group
        first = 1 + int(verdict.num_accepted.max())
        self._mask_logits = scored.logits[:, first : first + self.num_masks]  # [B, M, V]: offsets 2..M+1 of the pending
        self._ahead = verdict.num_accepted.to(self._mask_logits.device)  # [B] masks now behind each row's pending


class _TreeBita(BitaDrafter):
    proposes_trees = True

    def __init__(self, adapter: BitaAdapter, topk: int = 1, num_masks: int | None = None):
        super().__init__(adapter, topk, num_masks)
        self.tree = self.build_tree(topk, self.num_masks)
        self._level = self.tree.depth - 1  # [N] which mask token each node comes from
        self._attach = [-1, *range(self.tree.size)]  # a group after the pending token and after every node

    @staticmethod
    def build_tree(k: int, depth: int) -> TreeSpec:
        raise NotImplementedError

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._mask_logits is None:
            return empty_draft(state)
        top = self._mask_logits.topk(self.topk, dim=-1).indices  # [B, M, k]
        level, rank = self._level.to(top.device), self.tree.ranks.to(top.device)
        return Draft(tokens=top[:, level, rank], tree=self.tree)  # [B, N]

    def _groups(self, tree: bool, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A group after the pending token and after every node of a tree; one after the pending token of a chain
        (an empty draft)."""
        return self._layout(self.tree, length, self._attach) if tree else self._layout(None, length, [-1])

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        # scored: each row's kept positions right-aligned in 1 + max n columns, then every mask group
        n = verdict.num_accepted  # [B]
        if verdict.path.shape[1]:
            last = verdict.path.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]  # [B] each row's last kept node
            group = torch.where(n > 0, last + 1, 0)  # [B] the group after each row's last kept position
        else:  # nothing was drafted: the one group after the pending token
            group = torch.zeros_like(n)
        start = 1 + int(n.max()) + group * self.num_masks  # [B]
        index = start[:, None] + torch.arange(self.num_masks, device=start.device)[None]  # [B, M]
        logits = scored.logits
        self._mask_logits = logits.gather(1, index.to(logits.device)[..., None].expand(-1, -1, logits.shape[-1]))


class BitaEfficientDrafter(_TreeBita):
    build_tree = staticmethod(efficient_tree)


class BitaFullTreeDrafter(_TreeBita):
    build_tree = staticmethod(full_tree)
