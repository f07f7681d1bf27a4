"""bpd: blockwise heads on the target's hidden state; exact under greedy and sampling, one target call per step."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import CAUSAL_ARCHS, chi2_critical, chi2_statistic, reference_greedy, target_and_reference, varied_model
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters import BlockwiseDrafter, BlockwiseHeads
from draftverify.drafters.blockwise import HeadsConfig, lm_head_fingerprint
from draftverify.methods import MethodOptions, build_drafter, build_verifier

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


def random_heads(model, num_heads: int = 4, seed: int = 0, scale: float = 1.0) -> BlockwiseHeads:
    """Heads with every weight random (w2 too), so each head proposes something different."""
    heads = BlockwiseHeads.for_target(model, num_heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale * p.shape[-1] ** -0.5)
    return heads


def exact(params: SamplingParams | None = None):
    return build_verifier("exact", params or SamplingParams(), MethodOptions())


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
def test_prefill_hidden_state_read_through_the_lm_head_is_head_one(arch):
    """The hidden state the heads read is the one the target's own logits come from (after the final norm)."""
    model, _ = target_and_reference(arch, PROMPT, NEW)
    lm = CachedLM(model)
    lm.start(PROMPT, want_hidden=True)
    out = lm.prefilled
    assert out.hidden.shape == (
        1,
        PROMPT.shape[1] - 1,
        model.config.hidden_size if arch != "gpt2" else model.config.n_embd,
    )
    assert torch.allclose(model.get_output_embeddings()(out.hidden[:, -1:]), out.logits, atol=1e-9)
    full = model(PROMPT[:, :-1]).logits[:, -1:]
    assert torch.allclose(out.logits, full, atol=1e-6)


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
@pytest.mark.parametrize("num_heads", [2, 4, 9])
def test_bpd_equals_target_greedy(arch, num_heads):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    assert len(set(ref)) > 8  # varied text, so equivalence is not vacuous
    out = generate(
        model, BlockwiseDrafter(random_heads(model, num_heads)), exact(), PROMPT, max_new_tokens=NEW, gamma=8
    )
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.draft_calls == 0  # the heads cost no model forward of their own
    assert max(out.stats.gammas) == min(8, num_heads - 1)


def test_draft_is_the_heads_prediction_from_the_position_before_the_pending_token():
    """Whatever was accepted, the next draft is heads(hidden of tokens[-2]) recomputed from scratch."""
    model, ref = target_and_reference("llama", PROMPT, NEW)
    heads = random_heads(model, 4, seed=3)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Spy(BlockwiseDrafter):
        def propose(self, state, gamma):
            draft = super().propose(state, gamma)
            seen.append((state.tokens.clone(), draft.tokens.clone()))
            return draft

    generate(model, Spy(heads), exact(), PROMPT, max_new_tokens=NEW, gamma=3)
    assert len(seen) > 5
    lm_head = model.get_output_embeddings()
    with torch.no_grad():
        for tokens, draft in seen:
            hidden = model(tokens[:, :-1].clone(), output_hidden_states=True).hidden_states[-1][:, -1]  # [1, H]
            expected = heads(hidden, lm_head).argmax(dim=-1)[:, : draft.shape[1]]
            assert torch.equal(draft, expected)


def test_every_draft_accepted_gives_the_block_size_per_call():
    """A target whose final norm is zeroed predicts token 0 everywhere; heads with w2 = 0 copy head 1, so all
    h - 1 drafts are accepted each step (the bonus-token path): h tokens per target call."""
    model = copy.deepcopy(target_and_reference("llama", PROMPT, NEW)[0])
    with torch.no_grad():
        model.model.norm.weight.zero_()
    out = generate(
        model, BlockwiseDrafter(BlockwiseHeads.for_target(model, 4)), exact(), PROMPT, max_new_tokens=24, gamma=8
    )
    assert out.new_tokens[0].tolist() == reference_greedy(model, PROMPT, 24) == [0] * 24
    assert out.stats.target_calls == 6 and out.stats.rejections == 0


def test_one_token_prompt_drafts_from_the_first_verify_pass():
    model, _ = target_and_reference("qwen2", PROMPT, NEW)
    prompt = PROMPT[:, :1]
    out = generate(model, BlockwiseDrafter(random_heads(model)), exact(), prompt, max_new_tokens=12, gamma=3)
    assert out.new_tokens[0].tolist() == reference_greedy(model, prompt, 12)
    assert out.stats.gammas[0] == 0 and out.stats.gammas[1] == 3


def test_sampling_is_reproducible_and_follows_the_target():
    """First token at temperature 1: its law must be the target's softmax whatever the heads propose, and the
    heads' own law is far from it (so a rule that trusted the draft would fail the same threshold)."""
    model, _ = target_and_reference("llama", PROMPT, NEW)
    heads = random_heads(model, 3, seed=5, scale=3.0)
    params = SamplingParams(temperature=1.0, seed=11)
    runs = [
        generate(model, BlockwiseDrafter(heads), exact(params), PROMPT, params, max_new_tokens=NEW, gamma=2)
        for _ in range(2)
    ]
    assert runs[0].new_tokens.tolist() == runs[1].new_tokens.tolist()

    with torch.no_grad():
        p = model(PROMPT).logits[0, -1].softmax(-1)  # [V] the target's law of the first new token
        hidden = model(PROMPT[:, :-1], output_hidden_states=True).hidden_states[-1][:, -1]
        q = heads(hidden, model.get_output_embeddings())[0, 0].softmax(-1)  # head 2's law of that token
    draws = 1500
    counts = torch.zeros_like(p)
    for seed in range(draws):
        sampled = SamplingParams(temperature=1.0, seed=seed)
        out = generate(model, BlockwiseDrafter(heads), exact(sampled), PROMPT, sampled, max_new_tokens=1, gamma=1)
        counts[out.new_tokens[0, 0]] += 1
    assert chi2_statistic(counts, p) < chi2_critical(counts, p)  # a 1-in-1000 false alarm rate
    assert chi2_statistic(q * draws, p) > 10 * chi2_critical(counts, p)  # the heads' own law is far off


def test_save_load_round_trip_and_method_options(tmp_path):
    model, ref = target_and_reference("gpt_neox", PROMPT, NEW)
    heads = random_heads(model, 5, seed=2)
    heads.save(tmp_path / "heads", metadata={"note": "test"})
    loaded = BlockwiseHeads.load(tmp_path / "heads")
    assert loaded.config == heads.config
    for (name, a), (_, b) in zip(heads.named_parameters(), loaded.named_parameters()):
        assert torch.allclose(a.to(torch.float16).double(), b.double()), name
    drafter = build_drafter("bpd", CachedLM(model), MethodOptions(heads_path=tmp_path / "heads"))
    out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref


def test_heads_for_another_target_are_refused(tmp_path):
    llama, _ = target_and_reference("llama", PROMPT, NEW)
    qwen2, _ = target_and_reference("qwen2", PROMPT, NEW)  # same hidden size and vocabulary, other weights
    with pytest.raises(DraftVerifyError, match="another target"):
        generate(qwen2, BlockwiseDrafter(random_heads(llama)), exact(), PROMPT, max_new_tokens=4)
    config = HeadsConfig(4, 48, 48, 96, lm_head_fingerprint(llama.get_output_embeddings()))
    with pytest.raises(DraftVerifyError, match="hidden size 48"):
        generate(llama, BlockwiseDrafter(BlockwiseHeads(config)), exact(), PROMPT, max_new_tokens=4)


def test_bad_heads_input_is_refused(tmp_path):
    with pytest.raises(DraftVerifyError, match="needs trained heads"):
        build_drafter("bpd", CachedLM(target_and_reference("llama", PROMPT, NEW)[0]), MethodOptions())
    with pytest.raises(DraftVerifyError, match="no blockwise heads"):
        BlockwiseHeads.load(tmp_path)
    with pytest.raises(DraftVerifyError, match="2..9 heads"):
        HeadsConfig(10, 32, 32, 96, "x")
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        bart = varied_model("bart")
        generate(bart, BlockwiseDrafter(BlockwiseHeads.for_target(bart)), exact(), PROMPT, max_new_tokens=4)
