"""BildVerifier: roll back at the first draft token with -log p_target(x) > alpha_RB (BiLD section 3.4, eq. 3).

Logits are set to log-probabilities, so the distance of every token is known by construction.
"""

from __future__ import annotations

import math

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import BildVerifier, GreedyVerifier

torch.set_num_threads(1)

# one target distribution per position; the argmax (token 0 after the roll) is known
BASE = torch.tensor([0.6, 0.2, 0.1, 0.05, 0.03, 0.02], dtype=torch.float64)
V = BASE.numel()
# -log p: 0.51, 1.61, 2.30, 3.00, 3.51, 3.91


def _logits(n_positions: int) -> torch.Tensor:
    """Position i is BASE rolled by i: token t has probability BASE[(t - i) % V]; argmax at token i."""
    return torch.stack([BASE.roll(i).log() for i in range(n_positions)])


def _token(position: int, rank: int) -> int:
    """The token at `position` whose probability is BASE[rank]."""
    return (rank + position) % V


def _verify(verifier, drafts, params=SamplingParams(), generator=None):
    drafts = torch.tensor(drafts, dtype=torch.long)
    logits = _logits(drafts.shape[1] + 1)[None].expand(drafts.shape[0], -1, -1)
    return verifier.verify(Draft(tokens=drafts), logits, params, generator)


def test_rollback_at_first_token_beyond_threshold():
    verifier = BildVerifier(rollback_threshold=2.0)  # ranks 0, 1 (d <= 1.61) kept, ranks >= 2 (d >= 2.30) rolled back
    drafts = [
        [_token(0, 1), _token(1, 0), _token(2, 1)],  # all within: nothing rolled back
        [_token(0, 0), _token(1, 1), _token(2, 2)],  # rollback at position 2
        [_token(0, 1), _token(1, 3), _token(2, 0)],  # rollback at position 1; the later plausible token is dropped
        [_token(0, 5), _token(1, 0), _token(2, 0)],  # rollback at position 0
    ]
    verdict = _verify(verifier, drafts)
    assert verdict.num_accepted.tolist() == [3, 2, 1, 0]
    # kept prefix, then the target's own (argmax) token at the rollback position / the bonus position, then -1
    assert verdict.tokens.tolist() == [
        drafts[0] + [_token(3, 0)],
        drafts[1][:2] + [_token(2, 0), -1],
        drafts[2][:1] + [_token(1, 0), -1, -1],
        [_token(0, 0), -1, -1, -1],
    ]


@pytest.mark.parametrize(
    "threshold,expected",
    [(0.4, 0), (0.6, 1), (1.7, 2), (2.4, 3), (3.2, 4), (3.7, 5), (4.0, 6), (float("inf"), 6)],
)
def test_threshold_sweeps_the_accepted_length(threshold, expected):
    """Draft ranks 0..5 in order, so distances increase: the first with -log p > threshold is rolled back."""
    drafts = [[_token(i, i) for i in range(V)]]
    distances = [-math.log(float(BASE[i])) for i in range(V)]
    assert expected == next((i for i, d in enumerate(distances) if d > threshold), V)
    verdict = _verify(BildVerifier(threshold), drafts)
    assert verdict.num_accepted.tolist() == [expected]
    emitted = verdict.tokens[0, expected]
    assert int(emitted) == _token(expected, 0)


def test_no_rollback_when_all_within_threshold_gives_bonus_token():
    verifier = BildVerifier(rollback_threshold=10.0)
    drafts = [[_token(0, 5), _token(1, 4), _token(2, 3)]]  # each implausible but within 10 nats
    verdict = _verify(verifier, drafts)
    assert verdict.num_accepted.tolist() == [3]
    assert verdict.tokens.tolist() == [drafts[0] + [_token(3, 0)]]


def test_distance_is_shift_invariant_and_uses_the_target_soft_label():
    """-log softmax(logits)(x): adding a constant to the logits of a position changes nothing."""
    drafts = torch.tensor([[_token(0, 1), _token(1, 2)]])
    logits = _logits(3)[None].clone()
    base = BildVerifier(2.0).verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    logits[:, 1] += 50.0
    shifted = BildVerifier(2.0).verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    assert torch.equal(base.tokens, shifted.tokens)
    assert base.num_accepted.tolist() == [1]


def test_empty_draft_appends_target_token():
    verdict = BildVerifier(2.0).verify(
        Draft(tokens=torch.zeros(2, 0, dtype=torch.long)), _logits(1)[None].expand(2, 1, V), SamplingParams(), None
    )
    assert verdict.num_accepted.tolist() == [0, 0]
    assert verdict.tokens.tolist() == [[0], [0]]


def test_sampled_params_replace_with_a_target_sample():
    """At temperature > 0 the appended token is drawn from the target's filtered p; top_k=1 forces its argmax."""
    drafts = [[_token(0, 0), _token(1, 4)]]
    verdict = _verify(
        BildVerifier(2.0), drafts, SamplingParams(temperature=1.0, top_k=1), torch.Generator().manual_seed(0)
    )
    assert verdict.tokens.tolist() == [[_token(0, 0), _token(1, 0), -1]]
    # with top_k=2 the appended token is one of the two most likely at the rollback position, never the rejected one
    batch = 2000
    d = torch.tensor(drafts).expand(batch, 2)
    logits = _logits(3)[None].expand(batch, 3, V)
    verdict = BildVerifier(2.0).verify(
        Draft(tokens=d), logits, SamplingParams(temperature=1.0, top_k=2), torch.Generator().manual_seed(1)
    )
    appended = verdict.tokens[:, 1]
    assert set(appended.tolist()) == {_token(1, 0), _token(1, 1)}
    frac = float((appended == _token(1, 0)).double().mean())  # 0.6 / 0.8 = 0.75
    assert abs(frac - 0.75) < 5 * math.sqrt(0.75 * 0.25 / batch)


def test_zero_threshold_rolls_back_everything_infinite_keeps_everything():
    """alpha_RB = 0 rolls back every token with p < 1, which at temperature 0 still emits the target's argmax."""
    gen = torch.Generator().manual_seed(2)
    for _ in range(100):
        n = int(torch.randint(1, 5, (1,), generator=gen))
        logits = torch.randn(2, n + 1, 7, generator=gen, dtype=torch.float64)
        draft = torch.randint(0, 7, (2, n), generator=gen)
        verdict = BildVerifier(0.0).verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert verdict.num_accepted.tolist() == [0, 0]
        assert torch.equal(verdict.tokens[:, 0], logits[:, 0].argmax(-1))
        # and a never-rolling-back threshold keeps every draft token
        keep_all = BildVerifier(float("inf")).verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert keep_all.num_accepted.tolist() == [n, n]
        assert torch.equal(keep_all.tokens[:, :n], draft)
        greedy = GreedyVerifier().verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert (keep_all.num_accepted >= greedy.num_accepted).all()


@pytest.mark.parametrize("bad", [-0.1, -1e-9, -float("inf"), float("nan")])
def test_bad_threshold_raises(bad):
    with pytest.raises(DraftVerifyError):
        BildVerifier(rollback_threshold=bad)


@pytest.mark.parametrize("bad", [None, "2.0"])
def test_non_numeric_threshold_raises_draftverify_error(bad):
    with pytest.raises(DraftVerifyError):
        BildVerifier(rollback_threshold=bad)


def test_not_lossless_and_registered():
    assert BildVerifier().lossless is False
    assert BildVerifier.name == "bild"
    assert BildVerifier().rollback_threshold == 2.0
