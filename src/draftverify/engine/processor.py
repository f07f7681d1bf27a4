"""One logits processor, as the loop's processors (processors.py) and the grammar's (grammar.py) are written: the
interface (`Processor`, and `Mask` for those that forbid tokens), the rows it is told of (`RowStart`) and the
positions of a verify pass it processes, with the draft tokens each follows (`Step`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..processing import PLAIN, Processing
from ..types import DecodingState, Draft


@dataclass
class RowStart:
    """A row as its processors first see it: its settings, prompt (the decoder side), allowed first tokens (token
    healing; None: any) and the tokens that end it."""

    processing: Processing
    prompt: list[int]
    first_allowed: torch.Tensor | None
    stops: set[int]


NEUTRAL = RowStart(PLAIN, [], None, set())  # what a processor made after a row joined knows of the rows before


class Step:
    """The positions of one verify pass and what each follows: follows [P, N] (True where draft node j comes before
    the position: a chain's earlier tokens, a tree node's ancestors and itself), depth [P] (draft tokens before the
    position) and node_position [N] (the position that scores node j's token: its parent's)."""

    def __init__(self, draft: Draft, positions: list[int] | None = None):
        n = draft.length
        if draft.tree is None:
            parents = torch.arange(n) - 1
            follows = torch.ones(n, n, dtype=torch.bool).tril()
            depth = torch.arange(1, n + 1)
        else:
            parents = draft.tree.parents.cpu()
            follows = draft.tree.ancestor_mask.cpu()
            depth = draft.tree.depth.cpu()
        device = draft.tokens.device
        self.draft = draft
        self.parents: list[int] = parents.tolist()
        self.all_follows = torch.cat([torch.zeros(1, n, dtype=torch.bool), follows]).to(device)  # [1+N, N]
        self.all_depth = torch.cat([torch.zeros(1, dtype=torch.long), depth]).to(device)  # [1+N]
        self.node_position = (parents + 1).to(device)  # [N]
        self.positions = (
            torch.arange(1 + n, device=device) if positions is None else torch.tensor(positions, device=device)
        )
        self.follows = self.all_follows[self.positions]  # [P, N]
        self.depth = self.all_depth[self.positions]  # [P]

    def at(self, positions: list[int]) -> Step:
        """The same step at some of its positions (a re-scored branch's)."""
        step = Step.__new__(Step)
        step.__dict__.update(self.__dict__)
        step.positions = torch.tensor(positions, device=self.positions.device)
        step.follows = self.all_follows[step.positions]
        step.depth = self.all_depth[step.positions]
        return step


class Processor:
    """One kind of processing over the rows of a batch (rows without it pass through unchanged). Rows are added
    (add: at the start and when rows join), dropped (drop) and told each step's emitted tokens (commit)."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device

    @staticmethod
    def needed(row: RowStart) -> bool:
        raise NotImplementedError

    @property
    def active(self) -> bool:
        """False while it changes nothing (the loop then skips it)."""
        return True

    def add(self, rows: list[RowStart]) -> None:
        raise NotImplementedError

    def drop(self, keep: list[bool]) -> None:
        raise NotImplementedError

    def commit(self, emitted: list[list[int]]) -> None:
        """Each row's tokens emitted this step."""

    def __call__(self, logits: torch.Tensor, state: DecodingState, step: Step) -> torch.Tensor:
        """logits [B, P, V] float32 at step.positions (a copy: may be changed in place) -> processed."""
        raise NotImplementedError


class Mask(Processor):
    """A processor that forbids tokens (-inf); the cut reads allows() before the target scores the draft."""

    def prepare(self, state: DecodingState, step: Step) -> None:
        """This step's allowed sets, before allows() and the call (the grammar walks the draft here)."""

    def allows(self, step: Step) -> torch.Tensor:
        """[B, N] bool: whether each draft node's token is allowed where it is scored (step.node_position)."""
        raise NotImplementedError

    def forbid(self, values: torch.Tensor, step: Step, positions: torch.Tensor) -> torch.Tensor:
        """values [B, P, V] with -inf where a token is forbidden at verify position positions[i] ([P]) of step."""
        raise NotImplementedError

    def __call__(self, logits: torch.Tensor, state: DecodingState, step: Step) -> torch.Tensor:
        return self.forbid(logits, step, step.positions)


def wide_dtype(device: torch.device) -> torch.dtype:
    """The dtype settings are kept in: float64 (a float64 model's logits are processed in float64), save on a
    device without it (mps)."""
    return torch.float32 if device.type == "mps" else torch.float64


def kept_rows(rows: list, keep: list[bool]) -> list:
    return [r for r, k in zip(rows, keep) if k]
