"""Logits processors: constraints applied to the target's verify logits before the verifier judges them.

A processor sees each step's verify logits [B, 1+N, V] (position 0 scores the row's next token) and returns them,
changed or not. Whatever the method, the output is then the target's own decoding under the constraint (greedy:
the best allowed token; sampling: the target's distribution renormalised over what is allowed); drafts are never
constrained (a draft token the constraint rules out is simply rejected).
"""

from __future__ import annotations

import torch

from ..errors import DraftVerifyError


def allowed_ids(allowed, vocab_size: int) -> torch.Tensor | None:
    """One row's set of allowed tokens as ids [K] (validated), or None for a row without constraint."""
    if allowed is None:
        return None
    ids = torch.as_tensor(allowed).reshape(-1).long()
    if ids.numel() == 0:
        raise DraftVerifyError("first_token_allowed: a row's set of allowed first tokens is empty")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftVerifyError(
            f"first_token_allowed: token ids must be in [0, {vocab_size}), got {int(ids.min())}..{int(ids.max())}"
        )
    return ids


class FirstTokenAllowed:
    """The tokens each row's FIRST new token may be (token healing, healing.py): the next verify pass's position 0
    is set to -inf outside each constrained row's set; later passes go through untouched. Rows that join the batch
    bring their own sets for their own first token (join)."""

    def __init__(self, vocab_size: int, allowed=None, batch: int = 1):
        """allowed: ids [K] for every row, or one entry per row (ids, or None for a row without constraint)."""
        self.vocab_size = vocab_size
        self.rows: list[torch.Tensor | None] | None = None  # one entry per row while a first token is pending
        if allowed is None:
            return
        if isinstance(allowed, torch.Tensor):
            rows = [allowed_ids(allowed, vocab_size)] * batch
        else:
            rows = list(allowed)
            if len(rows) != batch:
                raise DraftVerifyError(f"first_token_allowed has {len(rows)} entries for {batch} rows")
            rows = [allowed_ids(a, vocab_size) for a in rows]
        self.rows = rows if any(a is not None for a in rows) else None

    def check(self, allowed: list) -> list[torch.Tensor | None]:
        """Joining rows' sets (one entry per row, None: unconstrained), validated before the rows join."""
        return [allowed_ids(a, self.vocab_size) for a in allowed]

    def join(self, joined: list[torch.Tensor | None], batch: int) -> None:
        """The last len(joined) of `batch` rows just joined (checked sets): they take their first token next."""
        if any(a is not None for a in joined):
            present: list[torch.Tensor | None] = [None] * (batch - len(joined))
            self.rows = present + joined

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return logits
        keep = torch.ones(logits.shape[0], logits.shape[-1], dtype=torch.bool, device=logits.device)  # [B, V]
        for b, ids in enumerate(self.rows):
            if ids is not None:
                keep[b] = False
                keep[b, ids.to(logits.device)] = True
        self.rows = None  # spent: every row has taken its first token
        logits = logits.clone()
        logits[:, 0] = logits[:, 0].masked_fill(~keep, float("-inf"))
        return logits
