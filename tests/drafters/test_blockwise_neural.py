"""bpd_neural: blockwise drafts locally rescored by a draft LM (Algorithm 2) stay exact and follow the rule."""

from __future__ import annotations

import pytest
import torch
from test_blockwise_lattice import NEW, PROMPT, exact, first_token_follows_the_target, random_heads

from conftest import CAUSAL_ARCHS, build_model, target_and_reference
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters import BlockwiseDrafter, BlockwiseNeuralDrafter
from draftverify.methods import MethodOptions, build_drafter
from draftverify.types import DecodingState

torch.set_num_threads(1)


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
def test_rescored_drafts_equal_target_greedy(arch):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    rescorer = CachedLM(build_model(arch, seed=7), role="draft")
    drafter = BlockwiseNeuralDrafter(random_heads(model, 5), rescorer, k=4, alpha=1.0)
    out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.draft_calls > 0  # one rescorer forward per draft token


def _first_draft(drafter, model):
    lm = CachedLM(model)
    tokens = lm.start(PROMPT, want_hidden=True)
    state = DecodingState(tokens, None, tokens.shape[1], SamplingParams(), None)
    drafter.bind(lm, 64)
    drafter.start(state, lm.prefilled)
    return drafter.propose(state, 3).tokens[0].tolist(), state


def test_alpha_zero_is_plain_bpd_and_a_huge_alpha_follows_the_rescorer_within_top_k():
    model, _ = target_and_reference("llama", PROMPT, NEW)
    heads = random_heads(model, 4, seed=1)
    rescorer_model = build_model("llama", seed=9)
    plain, _ = _first_draft(BlockwiseDrafter(heads), model)
    zero, _ = _first_draft(BlockwiseNeuralDrafter(heads, CachedLM(rescorer_model, role="draft"), k=4, alpha=0.0), model)
    assert zero == plain
    drafter = BlockwiseNeuralDrafter(heads, CachedLM(rescorer_model, role="draft"), k=4, alpha=1e6)
    chosen, state = _first_draft(drafter, model)
    top_k = drafter.head_logits()[0, :3].topk(4, dim=-1).indices  # [3, 4]
    context = state.tokens[0].tolist()
    with torch.no_grad():
        for j, token in enumerate(chosen):
            r = rescorer_model(torch.tensor([context + chosen[:j]])).logits[0, -1]  # [V]
            assert token == int(top_k[j][r[top_k[j]].argmax()])  # the rescorer's favourite among the k candidates


def test_samples_follow_the_target():
    model, _ = target_and_reference("gpt2", PROMPT, NEW)
    heads = random_heads(model, 3, seed=4)
    rescorer = build_model("gpt2", seed=5)
    assert first_token_follows_the_target(
        model, lambda: BlockwiseNeuralDrafter(heads, CachedLM(rescorer, role="draft"), k=4, alpha=1.0)
    )


def test_method_options_and_bad_input(tmp_path):
    model, ref = target_and_reference("qwen2", PROMPT, NEW)
    random_heads(model).save(tmp_path / "heads")
    draft = build_model("qwen2", seed=3)
    options = MethodOptions(heads_path=tmp_path / "heads", draft_model=draft, lattice_k=2, rescore_weight=0.5)
    drafter = build_drafter("bpd_neural", CachedLM(model), options)
    assert drafter.k == 2 and drafter.alpha == 0.5
    assert generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=3).new_tokens[0].tolist() == ref
    with pytest.raises(DraftVerifyError, match="draft"):
        build_drafter("bpd_neural", CachedLM(model), MethodOptions(heads_path=tmp_path / "heads"))
    with pytest.raises(DraftVerifyError, match="alpha"):
        BlockwiseNeuralDrafter(drafter.heads, CachedLM(draft, role="draft"), alpha=-1.0)
    with pytest.raises(DraftVerifyError, match="k >= 1"):
        BlockwiseNeuralDrafter(drafter.heads, CachedLM(draft, role="draft"), k=0)
