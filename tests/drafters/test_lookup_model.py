"""LookupModelDrafter: the lookup's draft when the context's last n-gram recurs, the draft model's otherwise,
with the model's cache catching up on the tokens it skipped; through the loop the output stays the target's."""

from __future__ import annotations

import pytest
import torch

from conftest import build_model, perturbed_copy, reference_greedy
from draftverify import SamplingParams, generate
from draftverify.drafters import LookupModelDrafter, ModelDrafter
from draftverify.errors import DraftVerifyError
from draftverify.methods import MethodOptions
from draftverify.types import DecodingState
from draftverify.verifiers import GreedyVerifier, GumbelCouplingVerifier

torch.set_num_threads(1)

REPEATING = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 33, 8, 41, 5, 17]])  # ... 5, 17: a 2-gram seen before


@pytest.fixture(scope="module")
def target():
    return build_model("llama", layers=2, seed=1, scale=2.5)


def state(tokens: torch.Tensor) -> DecodingState:
    return DecodingState(
        tokens=tokens, source_ids=None, prompt_length=tokens.shape[1], params=SamplingParams(), generator=None
    )


@torch.inference_mode()
def test_a_match_is_copied_without_a_model_forward_and_a_miss_asks_the_model(target):
    drafter = LookupModelDrafter(target, max_ngram=3, min_ngram=2)
    st = state(REPEATING)
    drafter.start(st)
    copied = drafter.propose(st, 4)
    assert copied.tokens[0].tolist() == [33, 8, 41, 5] and copied.q_probs is None
    assert drafter.forward_calls == 0 and drafter.lookup_steps == 1
    fresh = state(torch.tensor([[5, 17, 33, 8, 41, 60, 61]]))  # no 2-gram recurs
    drafter.start(fresh)
    modelled = drafter.propose(fresh, 3)
    alone = ModelDrafter(target)
    alone.start(fresh)
    assert torch.equal(modelled.tokens, alone.propose(fresh, 3).tokens)
    assert drafter.forward_calls == 3 and drafter.lookup_steps == 0


@pytest.mark.parametrize(
    "params, verifier",
    [(SamplingParams(), GreedyVerifier()), (SamplingParams(temperature=1.0, seed=4), GumbelCouplingVerifier())],
)
def test_mixing_both_drafters_keeps_the_targets_output(target, params, verifier):
    drafter = LookupModelDrafter(perturbed_copy(target, 0.5, seed=2), max_ngram=3, min_ngram=2)
    out = generate(target, drafter, verifier, REPEATING, params, max_new_tokens=40, gamma=4)
    alone = generate(
        target,
        ModelDrafter(perturbed_copy(target, 0.5, seed=2)),
        verifier,
        REPEATING,
        params,
        max_new_tokens=40,
        gamma=4,
    )
    assert out.new_tokens.tolist() == alone.new_tokens.tolist()
    if params.greedy:
        assert out.new_tokens[0].tolist() == reference_greedy(target, REPEATING, 40)
    assert drafter.lookup_steps > 0 and out.stats.draft_calls > 0  # both halves really drafted


def test_needs_a_draft_model(target):
    from draftverify.backends.hf.cached_lm import CachedLM

    with pytest.raises(DraftVerifyError, match="needs a draft model"):
        LookupModelDrafter.from_options(CachedLM(target), MethodOptions())
