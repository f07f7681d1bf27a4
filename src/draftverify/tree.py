"""Token-tree topology, built once and reused every step (Medusa's tree buffers, as a dataclass).

Node j of a tree of N nodes is one draft token. Its parent is another node or the root, and the root is the
pending token: the last committed token, not yet in the target's cache, which the verify pass scores first.
Nodes are in topological order (a parent's index is below its children's), so a chain is the tree whose
parents are -1, 0, 1, ..., N-2. Shapes: N nodes, P leaves (root-to-leaf paths), D the deepest depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import DraftVerifyError


@dataclass(frozen=True, eq=False)
class TreeSpec:
    parents: torch.Tensor  # [N] long; -1 = child of the root (the pending token)
    depth: torch.Tensor  # [N] long; 1 for the root's children
    ranks: torch.Tensor  # [N] long; order among its siblings (0 = first child), i.e. the path's last entry
    ancestor_mask: torch.Tensor  # [N, N] bool; [i, j] True when node j is node i or one of its ancestors
    position_offsets: torch.Tensor  # [N] long; position of each node after the pending token's (= depth)
    retrieve_indices: torch.Tensor  # [P, D] long; node indices root-to-leaf for each leaf, -1 padded

    @property
    def size(self) -> int:
        return self.parents.shape[0]

    @property
    def max_depth(self) -> int:
        return self.retrieve_indices.shape[1]

    @classmethod
    def from_parents(cls, parents: torch.Tensor | Sequence[int]) -> "TreeSpec":
        """parents [N]: -1 for the root's children, else the index of an earlier node."""
        parents = torch.as_tensor(parents, dtype=torch.long).cpu()
        if parents.dim() != 1 or parents.numel() == 0:
            raise DraftVerifyError(f"a tree needs a non-empty 1-D parents list, got shape {tuple(parents.shape)}")
        n = parents.numel()
        index = torch.arange(n)
        bad = (parents < -1) | (parents >= index)
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            raise DraftVerifyError(
                f"tree node {j} has parent {int(parents[j])}; parents must be -1 (the root) or an earlier node "
                "(topological order: parent index < child index)"
            )
        ancestor = torch.eye(n, dtype=torch.bool)
        depth = torch.ones(n, dtype=torch.long)
        ranks = torch.zeros(n, dtype=torch.long)
        children: dict[int, int] = {}
        for j, p in enumerate(parents.tolist()):  # built once per tree shape, not per step
            ranks[j] = children.get(p, 0)
            children[p] = int(ranks[j]) + 1
            if p >= 0:
                ancestor[j] |= ancestor[p]
                depth[j] = depth[p] + 1
        is_leaf = torch.ones(n, dtype=torch.bool)
        is_leaf[parents[parents >= 0]] = False
        leaves = is_leaf.nonzero().flatten()  # [P]
        max_depth = int(depth.max())
        retrieve = torch.full((leaves.numel(), max_depth), -1, dtype=torch.long)
        for row, leaf in enumerate(leaves.tolist()):
            path = ancestor[leaf].nonzero().flatten()  # ancestors in topological order = root-to-leaf order
            retrieve[row, : path.numel()] = path
        return cls(parents, depth, ranks, ancestor, depth.clone(), retrieve)

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> "TreeSpec":
        """Medusa-style paths: each node is the tuple of child ranks from the root, e.g. (0,), (1,), (0, 0).

        Every prefix of a path must itself be a path. Nodes are ordered by depth, then lexicographically, so
        the node index of a given path does not depend on the order the list is written in.
        """
        if len(paths) == 0:
            raise DraftVerifyError("a tree needs at least one path, e.g. [(0,)]")
        normalised = []
        for path in paths:
            if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
                raise DraftVerifyError(f"tree path {path!r} must be a non-empty tuple of child ranks, e.g. (0, 1)")
            if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in path):
                raise DraftVerifyError(f"tree path {tuple(path)!r} must hold integer child ranks >= 0")
            normalised.append(tuple(path))
        if len(set(normalised)) != len(normalised):
            raise DraftVerifyError("tree paths contain a duplicate; each node must appear once")
        ordered = sorted(normalised, key=lambda p: (len(p), p))
        index = {path: j for j, path in enumerate(ordered)}
        parents = []
        for path in ordered:
            if len(path) > 1 and path[:-1] not in index:
                raise DraftVerifyError(f"tree path {path!r} has no parent path {path[:-1]!r}; list every prefix")
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        spec = cls.from_parents(parents)
        declared = torch.tensor([p[-1] for p in ordered])
        if not torch.equal(declared, spec.ranks):
            raise DraftVerifyError(
                "tree paths skip a child rank (e.g. (1,) without (0,)); ranks under each parent must be 0, 1, 2, ..."
            )
        return spec

    @classmethod
    def chain(cls, length: int) -> "TreeSpec":
        return cls.from_parents(torch.arange(length) - 1)

    def verify_mask(self) -> torch.Tensor:
        """[N+1, N+1] bool ancestor-or-self mask of the verify pass: the pending token first, then the nodes."""
        n = self.size
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[1:, 1:] = self.ancestor_mask
        return mask

    def verify_positions(self) -> torch.Tensor:
        """[N+1] position offsets of the verify pass relative to the pending token (0, then each node's depth)."""
        return torch.cat([torch.zeros(1, dtype=torch.long), self.position_offsets])

    def to(self, device: torch.device | str) -> "TreeSpec":
        return TreeSpec(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def row_trees(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]], device: torch.device | str = "cpu"
) -> tuple[TreeSpec, torch.Tensor, torch.Tensor | None]:
    """Each row's own token tree (tokens [N_b] and parents [N_b], topological order) on one tree shape for the
    batch: the union of the rows' child-rank paths, so one verify forward scores every row. Returns the shape,
    tokens [B, N] (0 where a row lacks a node) and valid [B, N] (False there; None when every row has every node).
    A node a row lacks has no descendants in that row, and is never accepted (verifiers read Draft.valid)."""
    row_paths: list[list[tuple[int, ...]]] = []
    for _, parents in rows:
        paths: list[tuple[int, ...]] = []
        taken: dict[int, int] = {}  # parent -> children so far (the next child's rank)
        for parent in parents:
            rank = taken.get(parent, 0)
            taken[parent] = rank + 1
            paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
        row_paths.append(paths)
    union = sorted({path for paths in row_paths for path in paths}, key=lambda path: (len(path), path))
    spec = TreeSpec.from_paths(union)
    index = {path: j for j, path in enumerate(union)}
    tokens = torch.zeros(len(rows), len(union), dtype=torch.long)
    valid = torch.zeros(len(rows), len(union), dtype=torch.bool)
    for b, ((row_tokens, _), paths) in enumerate(zip(rows, row_paths)):
        columns = torch.tensor([index[path] for path in paths], dtype=torch.long)
        tokens[b, columns] = torch.tensor(list(row_tokens), dtype=torch.long)
        valid[b, columns] = True
    return spec, tokens.to(device), None if bool(valid.all()) else valid.to(device)
