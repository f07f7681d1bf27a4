"""model_tree: the draft model's top-k expansion as a static tree; exact, at least as good as its chain twin."""

from __future__ import annotations

import pytest
import torch

from conftest import CAUSAL_ARCHS, PlainStepsBetween, perturbed_copy, target_and_reference, varied_model
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.drafters import ModelDrafter, ModelTreeDrafter, NoDrafter
from draftverify.methods import MethodOptions, build_verifier
from draftverify.types import DecodingState
from draftverify.verifiers.tree import tree_speculative_sample

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


def exact():
    return build_verifier("exact", SamplingParams(), MethodOptions())


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
@pytest.mark.parametrize("draft_kind", ["self", "perturbed"])
def test_model_tree_equals_target_greedy(arch, draft_kind):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    draft = model if draft_kind == "self" else perturbed_copy(model, 0.5, seed=1)
    drafter = ModelTreeDrafter(draft)
    out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    if draft_kind == "self":  # the first branch is the target's own greedy text: 4 drafts + 1 per call
        assert out.stats.target_calls == -(-NEW // 5) and out.stats.rejections == 0
    calls = out.stats.target_calls  # one draft forward per tree level; within 3 tokens of the end the tree is
    assert 4 * calls - (3 + 2 + 1) <= out.stats.draft_calls <= 4 * calls  # cut to the remaining depth


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tree_accepts_at_least_as_much_as_the_chain_twin(arch):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    draft = perturbed_copy(model, 0.8, seed=2)
    tree = generate(model, ModelTreeDrafter(draft), exact(), PROMPT, max_new_tokens=NEW, gamma=4).stats
    chain = generate(model, ModelDrafter(draft), exact(), PROMPT, max_new_tokens=NEW, gamma=4).stats
    assert chain.rejections > 0  # otherwise the comparison says nothing
    assert tree.tokens_per_call >= chain.tokens_per_call


def test_gamma_caps_the_tree_depth():
    model, ref = target_and_reference("qwen2", PROMPT, NEW)
    drafter = ModelTreeDrafter(model)
    state = DecodingState(
        tokens=PROMPT, source_ids=None, prompt_length=PROMPT.shape[1], params=SamplingParams(), generator=None
    )
    tree_for = lambda gamma: drafter.subtree(drafter.nodes_for(state, gamma))  # noqa: E731
    assert tree_for(2).max_depth == 2 and tree_for(2).size == 6
    assert tree_for(9) is drafter.full_tree
    out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=2)
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.target_calls == -(-NEW // 3)


def test_plain_steps_between_trees_stay_exact():
    """After a step without a proposal the tree drafter has nothing to commit; its next proposal catches up."""
    model, ref = target_and_reference("llama", PROMPT, NEW)
    out = generate(
        model,
        ModelTreeDrafter(perturbed_copy(model, 0.5, seed=1)),
        exact(),
        PROMPT,
        max_new_tokens=NEW,
        gamma=PlainStepsBetween(),
    )
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.gammas[2] == 0 and out.stats.accepted_tokens > 0


def test_encoder_decoder_models_are_refused():
    model = varied_model("bart")
    with pytest.raises(DraftVerifyError, match="decoder-only"):
        generate(model, ModelTreeDrafter(model), exact(), PROMPT, max_new_tokens=4)


def test_malformed_tree_shape_is_refused():
    with pytest.raises(DraftVerifyError, match="no parent path"):
        ModelTreeDrafter(target_and_reference("llama", PROMPT, NEW)[0], paths=[(0,), (0, 0, 0)])


@pytest.mark.skipif(tree_speculative_sample is None, reason="tree sampling (verifiers/tree_sampling.py) not merged yet")
def test_model_tree_samples_reproducibly_at_temperature_one():
    model, _ = target_and_reference("llama", PROMPT, NEW)
    params = SamplingParams(temperature=1.0, seed=7, coupling=False)  # multi-draft speculative sampling
    verifier = build_verifier("exact", params, MethodOptions())
    runs = [
        generate(
            model,
            ModelTreeDrafter(perturbed_copy(model, 0.5, seed=1)),
            verifier,
            PROMPT,
            params,
            max_new_tokens=NEW,
            gamma=4,
        )
        for _ in range(2)
    ]
    assert runs[0].new_tokens.tolist() == runs[1].new_tokens.tolist()
    assert runs[0].stats.new_tokens == NEW and runs[0].stats.accepted_tokens > 0


def test_coupled_sampling_on_a_tree_gives_the_autoregressive_coupled_text():
    """Seeded (coupled) sampling verifies a tree by its Gumbel-max draws: the text is the target's own."""
    model, _ = target_and_reference("llama", PROMPT, NEW)
    params = SamplingParams(temperature=1.0, seed=11)
    verifier = build_verifier("exact", params, MethodOptions())
    assert verifier.name == "gumbel_coupling"
    alone = generate(model, NoDrafter(), verifier, PROMPT, params, max_new_tokens=NEW)
    tree = generate(model, ModelTreeDrafter(model), verifier, PROMPT, params, max_new_tokens=NEW, gamma=3)
    assert tree.new_tokens.tolist() == alone.new_tokens.tolist()
    assert tree.stats.accepted_tokens > 0 and tree.stats.target_calls < NEW
