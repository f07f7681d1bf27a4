"""eagle3: a one-layer head on three of the target's layers' inputs; exact, and its drafts are accepted once it has
learned the target."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import CAUSAL_ARCHS, left_padded, reference_greedy, varied_model
from draftverify import DraftVerifyError, RowRequest, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.draft_length import ConfidenceGamma
from draftverify.drafters.eagle3 import Eagle3Drafter, LayerInputsTarget, join_right_aligned
from draftverify.drafters.eagle3_head import Eagle3Head
from draftverify.methods import MethodOptions, build_verifier
from eagle3_heads import exact, head_for, trained_head

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
def test_the_wrapped_target_returns_the_chosen_layers_inputs(arch):
    """What the drafter reads is the inputs of layers aux_layers (Hugging Face's hidden_states[i]), at the prefilled
    positions and at a verify pass's positions, and the logits are the target's own."""
    model = varied_model(arch, layers=4)
    layers = (1, 2, 3)
    target = LayerInputsTarget.of(CachedLM(model), layers)
    target.start(PROMPT[:, :5], want_hidden=True)
    out = target.forward(PROMPT[:, 4:], want_hidden=True)
    full = model(PROMPT, output_hidden_states=True)
    expected = torch.cat([full.hidden_states[i] for i in layers], dim=-1)  # [1, 7, 3H]
    assert torch.allclose(target.prefilled.hidden, expected[:, :4], atol=1e-9)
    assert torch.allclose(out.hidden, expected[:, 4:], atol=1e-9)
    assert torch.allclose(out.logits, full.logits[:, 4:], atol=1e-6)
    assert target.forward(PROMPT[:, :1]).hidden is None  # features only when asked for


def test_logits_to_keep_cuts_the_wrapped_targets_logits_and_leaves_every_positions_layer_inputs():
    model = varied_model("llama", layers=4)
    target = LayerInputsTarget.of(CachedLM(model), (1, 2, 3))
    target.start(PROMPT[:, :5], want_hidden=True)
    out = target.forward(PROMPT[:, 4:], want_hidden=True, logits_to_keep=1)
    full = model(PROMPT, output_hidden_states=True)
    assert out.logits.shape[1] == 1 and torch.allclose(out.logits, full.logits[:, -1:], atol=1e-6)
    assert out.hidden.shape[1] == 3


def test_a_trained_head_drafts_accepted_tokens_and_the_text_stays_the_targets():
    model = varied_model("llama")
    reference = reference_greedy(model, PROMPT, NEW)
    assert len(set(reference)) > 8  # varied text, so equivalence is not vacuous
    head = trained_head(model, [PROMPT[0].tolist()], NEW)
    out = generate(model, Eagle3Drafter(head), exact(), PROMPT, max_new_tokens=NEW, gamma=5)
    assert out.new_tokens[0].tolist() == reference
    untrained = generate(model, Eagle3Drafter(head_for(model)), exact(), PROMPT, max_new_tokens=NEW, gamma=5)
    assert untrained.new_tokens[0].tolist() == reference
    # the fitted head is accepted far more often than a random one: the features reach it as trained
    assert out.stats.accepted_tokens >= 2 * max(untrained.stats.accepted_tokens, 1)
    assert out.stats.target_calls < untrained.stats.target_calls


def test_sampling_with_a_trained_head_is_reproducible_and_in_vocabulary():
    model = varied_model("llama")
    head = trained_head(model, [PROMPT[0].tolist()], NEW, steps=40)
    params = SamplingParams(temperature=0.8, seed=3)
    verifier = build_verifier("exact", params, MethodOptions())
    first = generate(model, Eagle3Drafter(head), verifier, PROMPT, params, max_new_tokens=NEW, gamma=4)
    again = generate(model, Eagle3Drafter(head), verifier, PROMPT, params, max_new_tokens=NEW, gamma=4)
    assert first.new_tokens.tolist() == again.new_tokens.tolist()
    assert first.new_tokens.shape[1] == NEW


def test_the_head_saves_as_an_eagle3_checkpoint_and_loads_back(tmp_path):
    model = varied_model("llama", layers=4)
    head = head_for(model)
    head.save(tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    # the fields llama.cpp's converter and vLLM's eagle3 loader read
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == config["vocab_size"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(head.config.aux_layers)
    assert config["target_hidden_size"] == model.config.hidden_size
    loaded = Eagle3Head.load(tmp_path / "head")
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.half().double()), name
    assert "midlayer.self_attn.q_proj.weight" in loaded.state_dict() and "fc.weight" in loaded.state_dict()


def test_a_head_for_another_target_is_refused_at_bind():
    model = varied_model("llama", layers=4)
    other = varied_model("qwen2", layers=4)
    with pytest.raises(DraftVerifyError, match="another target|trained for a target"):
        generate(model, Eagle3Drafter(head_for(other)), exact(), PROMPT, max_new_tokens=4)


def test_a_folder_without_a_head_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(DraftVerifyError, match="train eagle3"):
        Eagle3Head.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(DraftVerifyError, match="not an EAGLE-3 head written by draftverify"):
        Eagle3Head.load(tmp_path)


def test_encoder_decoder_targets_are_refused():
    model = varied_model("t5")
    with pytest.raises(DraftVerifyError, match="decoder-only"):
        LayerInputsTarget.of(CachedLM(model), (0, 0, 0))


ROWS = [[5, 17, 33, 8, 41, 5, 17], [9, 4], [60, 61, 62, 60, 61], [12]]  # the last: no features before its first step


@pytest.fixture(scope="module")
def fitted():
    """A target, a head fitted to its text after each of ROWS (so rows accept different amounts), its texts."""
    model = varied_model("llama")
    head = trained_head(model, [p for p in ROWS if len(p) > 1], 24, steps=80)
    return model, head, [reference_greedy(model, torch.tensor([p]), 24) for p in ROWS]


def policy(kind: str):
    """A fixed draft length, or the confidence stop under a fixed cap (no timings: batch and batch-1 runs draft
    alike, so their acceptance can be compared). The fitted head's max q is low on the 96 tokens; at 0.05 the rows'
    drafts end at different lengths."""
    return 3 if kind == "fixed" else ConfidenceGamma(0.05, fixed=5)


@pytest.mark.parametrize("kind", ["fixed", "confident"])
def test_rows_of_a_batch_equal_their_own_greedy_text(fitted, kind):
    """Left-padded rows of different lengths, leaving at their own limits, under a fixed length or the confidence
    stop (which ends the batch's draft when no row is confident; rows draft on past their own stops): each row's text
    is its batch-1 text, and at a fixed length it accepts as many drafts as alone."""
    model, head, refs = fitted
    limits = [24, 20, 24, 9]
    ids, mask = left_padded(ROWS)
    out = generate(
        model, Eagle3Drafter(head), exact(), ids, attention_mask=mask, max_new_tokens=limits, gamma=policy(kind)
    )
    assert out.rows == [r[:n] for r, n in zip(refs, limits)]
    alone = [
        generate(model, Eagle3Drafter(head), exact(), torch.tensor([p]), max_new_tokens=n, gamma=policy(kind)).stats
        for p, n in zip(ROWS, limits)
    ]
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # ragged acceptance
    if kind == "fixed":  # (under the stop a row's drafts are the batch's length, not its own)
        assert out.stats.accepted_tokens == sum(s.accepted_tokens for s in alone)


def test_rows_joining_between_steps_equal_their_own_text(fitted):
    """Continuous batching: a joining row has no features of its prompt and drafts from what it decodes after."""
    model, head, refs = fitted
    schedule = {2: [1, 2], 4: [3]}  # after step 2 rows 1 and 2 join, after step 4 row 3
    calls = []

    def admit():
        calls.append(len(calls) + 1)
        return [RowRequest(ROWS[i], 24) for i in schedule.get(len(calls), [])]

    out = generate(
        model, Eagle3Drafter(head), exact(), torch.tensor([ROWS[0]]), max_new_tokens=24, gamma=3, admit=admit
    )
    assert out.rows == refs and out.stats.accepted_tokens > 0


def test_coupled_sampling_rows_equal_their_own_seeded_text(fitted):
    model, head, _ = fitted
    params = SamplingParams(temperature=0.9, top_p=0.95, coupling=True)
    seeds = [3, 4, 5, 6]
    expected = [
        generate(
            model,
            Eagle3Drafter(head),
            exact(SamplingParams(temperature=0.9, top_p=0.95, seed=seed)),
            torch.tensor([prompt]),
            SamplingParams(temperature=0.9, top_p=0.95, seed=seed),
            max_new_tokens=16,
            gamma=3,
        )
        .new_tokens[0]
        .tolist()
        for prompt, seed in zip(ROWS, seeds)
    ]
    ids, mask = left_padded(ROWS)
    out = generate(
        model,
        Eagle3Drafter(head),
        exact(params),
        ids,
        params,
        attention_mask=mask,
        max_new_tokens=16,
        gamma=3,
        seeds=seeds,
    )
    assert out.rows == expected and out.stats.accepted_tokens > 0


def test_right_aligned_blocks_join_row_by_row():
    a = torch.tensor([[0, 1, 2], [9, 9, 5]])[..., None]  # row 0 holds 3, row 1 holds 1
    b = torch.tensor([[7, 8], [9, 6]])[..., None]  # row 0 holds 2, row 1 holds 1
    joined, counts = join_right_aligned(a, torch.tensor([3, 1]), b, torch.tensor([2, 1]))
    assert counts.tolist() == [5, 2] and joined[0, :, 0].tolist() == [0, 1, 2, 7, 8]
    assert joined[1, -2:, 0].tolist() == [5, 6]
