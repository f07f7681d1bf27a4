"""The first-token logits processor (token healing): one verify pass, position 0, each row's own set."""

from __future__ import annotations

import pytest
import torch

from draftverify import DraftVerifyError
from draftverify.engine.processors import FirstTokenAllowed, allowed_ids

VOCAB = 8


def logits(batch: int = 2, width: int = 3) -> torch.Tensor:
    return torch.arange(batch * width * VOCAB, dtype=torch.float).reshape(batch, width, VOCAB)  # [B, 1+N, V]


def test_no_constraint_passes_the_logits_through_untouched():
    given = logits()
    assert FirstTokenAllowed(VOCAB)(given) is given
    assert FirstTokenAllowed(VOCAB, [None, None], batch=2)(given) is given  # no row constrained


def test_one_set_for_every_row_masks_position_zero_only_and_only_once():
    given = logits()
    first = FirstTokenAllowed(VOCAB, torch.tensor([1, 5]), batch=2)
    out = first(given)
    for b in range(2):
        allowed = torch.isfinite(out[b, 0])
        assert allowed.nonzero().flatten().tolist() == [1, 5]
        assert torch.equal(out[b, 0, [1, 5]], given[b, 0, [1, 5]])
    assert torch.equal(out[:, 1:], given[:, 1:])  # draft positions are never constrained
    assert torch.isfinite(given).all()  # the target's own logits are left alone (a copy is masked)
    assert first(given) is given  # spent: later passes go through


def test_rows_without_a_set_stay_free():
    out = FirstTokenAllowed(VOCAB, [[2], None], batch=2)(logits())
    assert torch.isfinite(out[0, 0]).sum() == 1 and torch.isfinite(out[1, 0]).all()


def test_joining_rows_take_their_own_sets_at_the_next_pass():
    first = FirstTokenAllowed(VOCAB)
    first.join(first.check([None]), batch=3)
    assert first(logits(3)) is not None and first.rows is None  # nothing constrained: no set pending
    first.join(first.check([[3, 4], None]), batch=3)  # the last two of three rows just joined
    out = first(logits(3))
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[2, 0]).all()
    assert torch.isfinite(out[1, 0]).nonzero().flatten().tolist() == [3, 4]


@pytest.mark.parametrize(
    "allowed, message", [([], "is empty"), ([VOCAB], r"must be in \[0, 8\)"), ([-1], "must be in")]
)
def test_bad_sets_are_refused(allowed, message):
    with pytest.raises(DraftVerifyError, match=message):
        allowed_ids(allowed, VOCAB)
    with pytest.raises(DraftVerifyError, match=message):
        FirstTokenAllowed(VOCAB, [allowed], batch=1)


def test_one_entry_per_row():
    with pytest.raises(DraftVerifyError, match="first_token_allowed has 1 entries for 2 rows"):
        FirstTokenAllowed(VOCAB, [[1]], batch=2)
