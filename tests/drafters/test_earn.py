"""EarnedDrafter: each step the draft that earns most expected tokens per second (drafters/earn.py); the text is
the target's own whatever it chooses (the conformance suite runs it on every architecture and backend), and here
what it chooses and why."""

from __future__ import annotations

import pytest
import torch

from conftest import build_model, perturbed_copy, reference_greedy
from draftverify import generate
from draftverify.drafters import EarnedDrafter, ModelDrafter, PromptLookupDrafter, SuffixDrafter
from draftverify.drafters.earn import expected_kept
from draftverify.errors import DraftVerifyError
from draftverify.verifiers import GreedyVerifier

torch.set_num_threads(1)

REPEATING = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 33, 8, 41, 5, 17, 33, 8, 41, 5, 17]])


@pytest.fixture(scope="module")
def target():
    return build_model("llama", layers=2, seed=1, scale=2.5)


def drafter(model=None, explore_every: int = 16) -> EarnedDrafter:
    return EarnedDrafter(SuffixDrafter(), PromptLookupDrafter(3, 1), model, explore_every)


def test_expected_kept_sums_the_chances_of_each_prefix():
    assert expected_kept([]) == 0.0
    assert expected_kept([1.0, 1.0, 1.0]) == 3.0
    assert expected_kept([0.5, 0.5]) == pytest.approx(0.5 + 0.25)
    assert expected_kept([0.0, 1.0]) == 0.0


def test_a_flat_verify_pass_takes_a_doubtful_copy_whole_and_a_steep_one_prefers_plain_decoding():
    chances = [[0.9, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3, 0.3]]
    rows = [[1, 2, 3, 4, 5, 6, 7, 8]]
    flat, steep = drafter(), drafter()
    for tokens in (1, 2, 4, 8, 16):
        flat.verify.add(tokens, 0.010)  # width free: every further token that may be kept earns
        steep.verify.add(tokens, 0.004 * tokens)  # every scored token costs a decode
    flat_rate, flat_width = flat._priced_prefix(rows, chances)
    steep_rate, steep_width = steep._priced_prefix(rows, chances)
    assert flat_width == 8 and steep_width == 1
    assert flat_rate > 1 / flat.verify(1)  # beats plain decoding
    assert steep_rate < 1 / steep.verify(1)  # where every scored token costs a decode, even 0.9 does not pay


@pytest.mark.parametrize("curve", [True, False])
def test_a_priced_prefix_is_the_best_rate_over_every_common_width_of_the_rows(curve):
    """_priced_prefix against its definition: each width's expected kept tokens summed over the rows (a row shorter
    than the width keeps its whole draft), over the verify pass of that width; the best rate and its width, exactly."""
    generator = torch.Generator().manual_seed(3)
    earn = drafter()
    if curve:
        earn.verify.seed({1: 0.004, 2: 0.009, 4: 0.011, 8: 0.018, 16: 0.022, 32: 0.040})
    else:
        for tokens in (2, 5, 9, 17, 33):
            earn.verify.add(tokens, 0.003 + 0.0009 * tokens)
    for _ in range(40):
        count = int(torch.randint(1, 4, (1,), generator=generator))
        lengths = torch.randint(1, 33, (count,), generator=generator).tolist()
        chances = [torch.rand(n, generator=generator).tolist() for n in lengths]
        rows = [list(range(n)) for n in lengths]
        best = (0.0, 0)
        for width in range(1, max(lengths) + 1):
            kept = sum(expected_kept(c[:width]) for c in chances)
            rate = (count + kept) / max(earn.verify(count * (1 + width)), 1e-9)
            if rate > best[0]:
                best = (rate, width)
        assert earn._priced_prefix(rows, chances) == best


def test_the_text_is_the_targets_and_the_model_drafts_only_where_lookups_have_nothing(target):
    draft = perturbed_copy(target, 0.02, seed=3)
    earn = drafter(ModelDrafter(draft))
    out = generate(target, earn, GreedyVerifier(), REPEATING, max_new_tokens=24, gamma=4)
    assert out.new_tokens[0].tolist() == reference_greedy(target, REPEATING, 24)
    assert sum(earn.chosen.values()) == out.stats.target_calls
    assert earn.chosen["lookup"] + earn.chosen["suffix"] > 0  # the text repeats: copies are taken


def test_a_source_passed_over_for_long_is_tried_once(target):
    earn = drafter(explore_every=2)
    generate(target, earn, GreedyVerifier(), REPEATING, max_new_tokens=24, gamma=4)
    assert earn.chosen["suffix"] > 0 and earn.chosen["lookup"] > 0


def test_explore_every_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(DraftVerifyError, match="explore_every"):
            drafter(explore_every=bad)


def test_the_model_is_tried_before_what_it_earned_prices_it_and_a_catch_up_is_not_a_steps_cost():
    from draftverify.drafters.earn import MIN_MODEL_STEPS

    earn = drafter()
    earn.verify.seed({1: 0.003, 2: 0.007, 4: 0.008, 8: 0.012})  # a quantized file's kinked curve
    plain = earn._rate(0.0, 1, 0)
    earn._previous = "none"  # the model's first step after plain decoding: it caught up on the skipped tokens
    earn._earned_by_model(kept=0.5, width=2.0, drafting=0.050)
    assert earn.model_earned == (0.5, 2.0, 0.0)  # the catch-up's seconds are left out
    assert earn._model_offer(1) > plain  # one poor step does not price it yet: it is tried again
    earn._previous = "model"
    for _ in range(MIN_MODEL_STEPS):
        earn._earned_by_model(kept=0.5, width=2.0, drafting=0.002)
    assert earn.model_earned[2] > 0.0
    assert earn._model_offer(1) < plain  # measured: half a token kept for a 3-token pass loses to plain decoding


def test_the_model_source_drafts_as_the_model_method_does(target):
    """earn's draft model is the `model` method's drafter made from the same options: staged drafting and lookup's
    agreement as confidence included, and the user's settings of them heard."""
    from draftverify.methods import build_drafter
    from draftverify.options import MethodOptions

    draft = perturbed_copy(target, 0.02, seed=3)
    for options in (
        MethodOptions(draft_model=draft),
        MethodOptions(draft_model=draft, lookup_tokens=2, lookup_confirms=False),
    ):
        earn, model = build_drafter("earn", None, options), build_drafter("model", None, options)
        assert type(earn.model) is type(model) and type(earn.model.lm) is type(model.lm)
        assert (earn.model.lookup_tokens, earn.model.lookup_confirms) == (model.lookup_tokens, model.lookup_confirms)
        assert earn.model.lookup_tokens == options.lookup_tokens
        assert earn.model.lookup_ngrams == model.lookup_ngrams
