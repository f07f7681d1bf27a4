"""The lean backend (backends/lean.py): a Llama-family draft model's forward in plain torch ops.

Its logits must be HF's own: checked against the model's forward through CachedLM fed the same calls (on a copy of
the model, since dynamic rope types keep state in the rotary module) and against a from-scratch HF forward of each
sequence, for Llama, Mistral and Qwen2 configs with GQA, rope scalings, tied and untied heads: prefill, chains,
rollback and re-forward, a token tree with its ancestor mask and the commit of a branch. Methods that run a draft
model give the target's own greedy text with a lean draft (the target verifies) at CachedLM's acceptance, and what
LeanLM cannot run stays on CachedLM.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import VOCAB, build_model, forward_atol, perturbed_copy, reference_greedy, target_and_reference
from draftverify import DraftVerifyError, RowRequest, SamplingParams, generate
from draftverify.backends.base import is_backend
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.backends.lean import LeanLM
from draftverify.backends.lean_draft import ENV_SWITCH, LeanDraft, draft_backend, lean_reason
from draftverify.drafters import ModelDrafter
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.tree import TreeSpec

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    eos_token_id=3,
    bos_token_id=1,
    pad_token_id=0,
)
ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 10000.0,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
}
# name -> (config class, model class, config options): GQA (4 query heads on 2 kv heads) unless said otherwise
CONFIGS = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(num_key_value_heads=2, max_position_embeddings=256)),
    "llama-mha-tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True),
    ),
    "llama-bias": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(num_key_value_heads=2, max_position_embeddings=256, attention_bias=True, mlp_bias=True),
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(num_key_value_heads=2, max_position_embeddings=256, sliding_window=None, head_dim=16),
    ),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(num_key_value_heads=2, max_position_embeddings=256)),
    "qwen2-tied": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True),
    ),
    **{
        f"llama-rope-{name}": (
            LlamaConfig,
            LlamaForCausalLM,
            dict(num_key_value_heads=2, rope_parameters=rope, max_position_embeddings=24 if name == "dynamic" else 256),
        )
        for name, rope in ROPES.items()
    },
}


def tiny(name: str, dtype=torch.float64, seed: int = 0):
    """A tiny random model of CONFIGS[name] with peaked logits, eager attention (the float64 reference path)."""
    config_cls, model_cls, options = CONFIGS[name]
    config = config_cls(**SMALL, **options)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
        for p in model.parameters():  # biases start at zero: give them values so they are exercised
            if p.dim() == 1 and not p.abs().sum():
                p.normal_(0, 0.5)
    return model


def close(a: torch.Tensor, b: torch.Tensor, model) -> None:
    assert a.shape == b.shape
    diff = float((a - b).abs().max())
    assert diff <= forward_atol(model, b), diff


def full(model, ids: list[int]) -> torch.Tensor:
    """HF's from-scratch next-token logits at every position of ids [L] -> [L, V]."""
    return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.fixture(autouse=True)
def _no_grad():
    """no_grad, not inference_mode: models built here may be the session's shared ones (target_and_reference),
    which later tests train through."""
    with torch.no_grad():
        yield


# ---- logits equal HF's own forward -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CONFIGS))
def test_chain_logits_equal_hf_through_prefill_chains_and_rollback(name):
    model = tiny(name)
    lean, hf = LeanLM(model), CachedLM(copy.deepcopy(model), role="draft")
    for lm in (lean, hf):
        lm.start(PROMPT)  # no check_fits: the dynamic-rope model runs past its 24 positions, where its rope scales
    close(lean.prefilled.logits, hf.prefilled.logits, model)
    calls = [
        ([17], 1),
        ([9, 10, 11], 1),
        ([12, 13], 2),
        ([14], 0),
        ([15, 16, 18, 19, 20], 3),
        ([21] * 9, 9),
        ([22, 23], 2),
        (list(range(30, 50)), 20),
    ]  # (tokens fed, how many of the tail to keep)
    for tokens, keep in calls:
        step = torch.tensor([tokens])
        close(lean.forward(step).logits, hf.forward(step).logits, model)
        lean.commit(keep)
        hf.commit(keep)
        assert lean.length == lean.committed == hf.length
    if name != "llama-rope-dynamic":  # dynamic rope's incremental forward differs from a from-scratch one in HF too
        seq = lean.fed_tokens()[0].tolist() + [7]
        close(lean.forward(torch.tensor([[7]])).logits[0], full(model, seq)[-1:], model)


def test_logits_to_keep_gives_the_last_positions_of_a_full_forward():
    """A draft catching up reads its last position alone: logits_to_keep=k gives the last k positions' logits (the
    output layer runs on those rows only), as a forward of every position gives them; k past n gives all n."""
    model = tiny("llama")
    every, last = LeanLM(model), LeanLM(model)
    for lm in (every, last):
        lm.start(PROMPT)
    step = torch.tensor([[9, 10, 11, 12]])
    want = every.forward(step).logits  # [1, 4, V]
    close(last.forward(step, logits_to_keep=2).logits, want[:, 2:], model)
    assert last.length == every.length  # every token is fed
    close(
        last.forward(torch.tensor([[13]]), logits_to_keep=3).logits, every.forward(torch.tensor([[13]])).logits, model
    )


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2-tied", "llama-rope-yarn"])
def test_a_tree_scores_each_branch_as_hf_scores_its_path(name):
    """A tree forward with depth positions and an ancestor mask over the tail; then a branch is committed and the
    next forward continues that branch."""
    model = tiny(name)
    lean = LeanLM(model)
    prompt = PROMPT[0].tolist()
    lean.start(PROMPT)
    lean.forward(torch.tensor([[prompt[-1], 40]]))  # two pending tokens in the tail before the tree
    lean.commit(1)  # keep the last prompt token, drop the 40 (a rollback under the tree)
    tree = TreeSpec.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    nodes = torch.tensor([[50, 51, 52, 53, 54, 55]])  # one token per node, in node order
    pending = torch.tensor([[60]])
    tail = 1  # the pending token
    mask = torch.zeros(tail + tree.size, tail + tree.size, dtype=torch.bool)  # [pending + nodes, ...]
    mask[:, :tail] = torch.ones(tail + tree.size, tail, dtype=torch.bool).tril()
    mask[tail:, tail:] = tree.ancestor_mask
    positions = lean.length + torch.cat([torch.zeros(1, dtype=torch.long), tree.depth])[None]
    out = lean.forward(torch.cat([pending, nodes], dim=1), positions, mask).logits[0]  # [1 + N, V]
    for node in range(tree.size):
        path = [int(nodes[0, j]) for j in range(tree.size) if tree.ancestor_mask[node, j]]
        close(out[1 + node], full(model, prompt + [60] + path)[-1], model)
    branch = [0, 2, 5]  # nodes (0,), (0, 0), (0, 0, 0)
    lean.commit(torch.tensor([[0] + [1 + b for b in branch]]))  # tail offsets: the pending token, then the branch
    after = lean.forward(torch.tensor([[61]])).logits[0, -1]
    close(after, full(model, prompt + [60] + [int(nodes[0, b]) for b in branch] + [61])[-1], model)


def test_float32_few_row_linears_match_hf():
    """Float32 takes the W @ x.T layout for 2..8 rows: still HF's logits (float32 tolerance)."""
    model = tiny("llama", dtype=torch.float32)
    lean, hf = LeanLM(model), CachedLM(model, role="draft")
    for lm in (lean, hf):
        lm.start(PROMPT)
    for width in (1, 2, 4, 8, 12):
        step = torch.arange(20, 20 + width)[None]
        close(lean.forward(step).logits, hf.forward(step).logits, model)
        lean.commit(width)
        hf.commit(width)


def test_buffers_grow_past_their_capacity_keeping_what_they_hold():
    model = tiny("llama")
    lean = LeanLM(model)
    lean.start(PROMPT)
    capacity = lean.capacity
    ids = PROMPT[0, :-1].tolist()  # start() holds all but the last prompt token
    while lean.capacity == capacity:
        step = torch.tensor([[len(ids) % 90 + 4] * 40])
        lean.forward(step)
        lean.commit(40)
        ids += step[0].tolist()
    close(lean.forward(torch.tensor([[9]])).logits[0, -1], full(model, ids + [9])[-1], model)


# ---- the protocol ------------------------------------------------------------------------------------------------
def test_protocol_flags_and_one_line_errors():
    model = tiny("llama")
    lean = LeanLM(model)
    assert is_backend(lean) and is_backend(LeanDraft(model))
    assert lean.takes_positions and not lean.supports_rows and not lean.exposes_hidden and not lean.has_modules
    with pytest.raises(DraftVerifyError, match="one unpadded row"):
        lean.start(torch.tensor([[5, 6], [7, 8]]))
    lean.start(PROMPT)
    with pytest.raises(DraftVerifyError, match="logits only"):
        lean.forward(torch.tensor([[5]]), want_hidden=True)
    with pytest.raises(DraftVerifyError, match="attention mask must cover"):
        lean.forward(torch.tensor([[5, 6]]), attention_mask=torch.ones(2, 5, dtype=torch.bool))
    lean.forward(torch.tensor([[5, 6]]))
    with pytest.raises(DraftVerifyError, match="cannot keep 3 positions of a 2-position tail"):
        lean.commit(3)
    with pytest.raises(DraftVerifyError, match="attends to at most 256 positions"):
        lean.check_fits(300)


# ---- where it is used, and where not -----------------------------------------------------------------------------
def test_unsupported_models_and_the_switches_keep_cached_lm(monkeypatch):
    gpt2 = build_model("gpt2")
    assert type(draft_backend(gpt2)) is CachedLM
    with pytest.raises(DraftVerifyError, match="cannot run on the lean backend .*GPT2LMHeadModel"):
        LeanLM(gpt2)
    windowed = tiny("mistral")
    windowed.config.sliding_window = 16
    assert "sliding-window" in lean_reason(windowed)
    assert type(draft_backend(windowed)) is CachedLM
    model = tiny("llama")
    assert type(draft_backend(model)) is LeanDraft
    assert type(draft_backend(model, lean=False)) is CachedLM
    assert lean_reason(model, compile=True) is not None  # a compiled draft stays on CachedLM
    assert type(draft_backend(LeanDraft(model))) is LeanDraft  # a backend given in is used as it is
    options = MethodOptions(draft_model=model)
    assert type(build_drafter("model", None, options).lm) is LeanDraft
    assert type(build_drafter("model", None, MethodOptions(draft_model=model, lean_draft=False)).lm) is CachedLM
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert type(build_drafter("model_tree", None, options).lm) is CachedLM
    assert type(build_drafter("lookup_model", None, options).model.lm) is CachedLM


NEW = 40


def exact():
    return build_verifier("exact", SamplingParams(), MethodOptions())


@pytest.mark.parametrize("method", ["model", "lookup_model", "model_tree"])
@pytest.mark.parametrize("gamma", [1, 4, "conf"])
def test_methods_with_a_lean_draft_give_the_target_greedy_text(method, gamma):
    target, ref = target_and_reference("llama", PROMPT, NEW)
    draft = perturbed_copy(target, 0.5, seed=1)
    stats = {}
    for lean in (True, False):
        drafter = build_drafter(method, target, MethodOptions(draft_model=draft, lean_draft=lean))
        assert isinstance(drafter.model.lm if method == "lookup_model" else drafter.lm, LeanDraft if lean else CachedLM)
        out = generate(target, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=gamma)
        assert out.new_tokens[0].tolist() == ref
        stats[lean] = out.stats
    if gamma != "conf":  # conf's cap follows measured timings; fixed lengths draft the same tokens on either backend
        assert stats[True].accepted_tokens > 0
        assert abs(stats[True].alpha - stats[False].alpha) <= 0.05
        assert abs(stats[True].target_calls - stats[False].target_calls) <= 1


def test_qwen2_draft_for_a_qwen2_target():
    target, ref = target_and_reference("qwen2", PROMPT, NEW)
    drafter = build_drafter("model", target, MethodOptions(draft_model=perturbed_copy(target, 0.3, seed=2)))
    assert isinstance(drafter.lm, LeanDraft)
    out = generate(target, drafter, exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref and out.stats.accepted_tokens > 0


PROMPTS = [[5, 17, 33, 8, 41, 5, 17], [9, 4, 22], [30, 31, 32, 33, 34], [6, 7]]


def test_batches_run_on_cached_lm_and_a_lone_row_moves_there_when_rows_join():
    target, _ = target_and_reference("llama", PROMPT, NEW)
    draft = perturbed_copy(target, 0.5, seed=1)
    refs = [reference_greedy(target, torch.tensor([p]), 12) for p in PROMPTS]
    drafter = ModelDrafter(LeanDraft(draft))
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in PROMPTS])
    out = generate(target, drafter, exact(), ids, attention_mask=mask, max_new_tokens=12, gamma=3)
    assert out.rows == refs and drafter.lm.active is drafter.lm._rows
    single = generate(target, drafter, exact(), torch.tensor([PROMPTS[0]]), max_new_tokens=12, gamma=3)
    assert single.new_tokens[0].tolist() == refs[0] and drafter.lm.active is drafter.lm.lean
    pending = [[], [RowRequest(PROMPTS[1], 12), RowRequest(PROMPTS[2], 12)], [], [RowRequest(PROMPTS[3], 12)]]
    drafter = ModelDrafter(LeanDraft(draft))
    out = generate(
        target,
        drafter,
        exact(),
        torch.tensor([PROMPTS[0]]),
        max_new_tokens=12,
        gamma=3,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == refs and drafter.lm.active is drafter.lm._rows
