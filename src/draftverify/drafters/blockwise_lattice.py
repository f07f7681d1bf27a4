"""BPD drafts chosen from the heads' top-k lattice by global n-gram rescoring (paper section 7.2).

`bpd_ngram` (p = 1) verifies the single best rescored path as a chain; `bpd_pbest` merges the p best paths into
one token tree (shared prefixes become shared nodes) verified in the same single target forward. Drafts are
deterministic candidates (q one-hot), so greedy and sampling stay exact under the chain and tree verifiers.
"""

from __future__ import annotations

import torch

from ..backends.base import LMBackend
from ..errors import DraftVerifyError, OptionValueError, check_number
from ..tree import row_trees
from ..types import DecodingState, Draft
from .base import empty_draft
from .blockwise import BlockwiseDrafter, BlockwiseHeads, load_heads
from .lattice import SausageLattice, kbest_paths
from .ngram import NgramTable
from .prompt_lookup_tree import trie


class BlockwiseNgramDrafter(BlockwiseDrafter):
    """The heads' top-k lattice rescored with an n-gram table; proposes the p best paths (p = 1: a chain)."""

    def __init__(self, heads: BlockwiseHeads, table: NgramTable, k: int = 4, alpha: float = 0.5, p: int = 1):
        super().__init__(heads)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise OptionValueError(f"the lattice needs k >= 1 candidates per head, got {k!r}")
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise OptionValueError(f"p-best rescoring needs p >= 1 paths, got {p!r}")
        self.table = table
        self.k = k
        self.alpha = check_number("n-gram weight alpha", alpha, 0.0)
        self.p = p

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "BlockwiseNgramDrafter":
        return cls(load_heads(options), _load_table(options), options.lattice_k, options.ngram_weight, 1)

    def bind(self, target: LMBackend, max_positions: int) -> None:
        super().bind(target, max_positions)
        if self.table.vocab_size != target.vocab_size:
            raise DraftVerifyError(
                f"the n-gram table was built for a vocabulary of {self.table.vocab_size} tokens but the target has "
                f"{target.vocab_size}; rebuild it with the target's tokenizer"
            )
        if self.p > 1 and not target.takes_positions:
            raise DraftVerifyError(
                "p-best drafts are verified as a token tree, which needs a target taking position_ids"
            )

    def verify_width(self, longest: int) -> int:
        return longest * self.p + 1  # p paths merged into one tree, each as long

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        """Each row's own lattice, rescored with its own context: one path per row is a chain (rows of one
        length), p paths per row a trie per row on one tree shape (tree.row_trees)."""
        if self._hidden is None:
            return empty_draft(state)
        head_logits = self.head_logits()[:, :gamma]  # [B, n, V]
        found = []
        for b in range(state.tokens.shape[0]):
            lattice = SausageLattice.top_k(head_logits[b], self.k)
            context = state.row_ids(b)[-self.table.order :]
            found.append(kbest_paths(lattice, self.table, context, self.alpha, self.p))
        device = state.tokens.device
        if all(len(paths) == 1 for paths in found) and len({len(paths[0]) for paths in found}) == 1:
            return Draft(tokens=torch.tensor([paths[0] for paths in found], device=device))
        tree, tokens, valid = row_trees([trie(paths) for paths in found], device)
        return Draft(tokens=tokens, tree=tree, valid=valid)


class BlockwisePBestDrafter(BlockwiseNgramDrafter):
    """p > 1 rescored paths as one tree (p-best n-gram BPD; alpha = 0 gives p-best 0-gram BPD)."""

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "BlockwisePBestDrafter":
        return cls(load_heads(options), _load_table(options), options.lattice_k, options.ngram_weight, options.pbest)


def _load_table(options) -> NgramTable:
    if options.ngram_path is None:
        raise DraftVerifyError("lattice rescoring needs an n-gram table: pass ngram_path=... (CLI: --ngram PATH)")
    return NgramTable.load(options.ngram_path)
