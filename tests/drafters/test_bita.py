"""BiTA: mask tokens (+ a prompt only they see) on a frozen target; chain, full-tree and efficient-tree decoding."""

from __future__ import annotations

import pytest
import torch

from conftest import chi2_critical, chi2_statistic, forward_atol, target_and_reference, varied_model
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters import NoDrafter
from draftverify.drafters.bita import (
    BitaDrafter,
    BitaEfficientDrafter,
    BitaFullTreeDrafter,
    efficient_tree,
    full_tree,
    mask_groups,
)
from draftverify.drafters.bita_adapter import BitaAdapter
from draftverify.methods import METHODS, MethodOptions, build_drafter, build_verifier
from draftverify.train.bita import mask_logits

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 60, 5, 17, 33, 9]])
NEW = 24
MODES = {"bita_chain": (BitaDrafter, 1), "bita": (BitaEfficientDrafter, 3), "bita_tree": (BitaFullTreeDrafter, 2)}


def exact(params: SamplingParams | None = None):
    return build_verifier("exact", params or SamplingParams(), MethodOptions())


def adapter_for(model, prompt: str = "deep", masks: int = 3, seed: int = 0, scale: float = 1.0) -> BitaAdapter:
    torch.manual_seed(seed)
    adapter = BitaAdapter.for_target(model, masks, prompt, 4)
    with torch.no_grad():
        for p in adapter.parameters():
            p.mul_(scale)
    return adapter


# ---------------------------------------------------------------- hand-drawn trees and mask layouts


def test_efficient_tree_topk_per_level_only_the_top1_continues():
    tree = efficient_tree(2, 3)  # levels: (0,) (1,) | (0,0) (0,1) | (0,0,0) (0,0,1)
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2, 2]
    assert tree.depth.tolist() == [1, 1, 2, 2, 3, 3]
    assert tree.ranks.tolist() == [0, 1, 0, 1, 0, 1]
    assert tree.retrieve_indices.tolist() == [[1, -1, -1], [0, 3, -1], [0, 2, 4], [0, 2, 5]]


def test_full_tree_holds_every_combination():
    tree = full_tree(2, 2)  # (0,) (1,) (0,0) (0,1) (1,0) (1,1)
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 1]
    assert tree.retrieve_indices.tolist() == [[0, 2], [0, 3], [1, 4], [1, 5]]
    assert full_tree(3, 3).size == 3 + 9 + 27


def test_mask_groups_see_their_node_its_ancestors_and_their_own_group():
    tree = efficient_tree(2, 2)  # nodes 0:(0,) 1:(1,) 2:(0,0) 3:(0,1)
    positions, mask = mask_groups(tree, 4, [-1, 0, 1, 2, 3], 2)
    # group g = pending, node 0..3: masks at depth(node) + 1, + 2
    assert positions.tolist() == [1, 2, 2, 3, 2, 3, 3, 4, 3, 4]
    #            pend n0 n1 n2 n3 | g0    g1    g2    g3    g4
    expected = [
        [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # group of the pending token, mask 1
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # ... mask 2 sees mask 1
        [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # group of node 0
        [1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],  # node 1 (a root child, not node 0's)
        [1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],  # node 2 = node 0's child
        [1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],  # node 3 = node 0's other child
        [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]
    assert mask.int().tolist() == expected


def test_chain_mask_group_does_not_see_the_draft():
    positions, mask = mask_groups(None, 2, [-1], 3)
    assert positions.tolist() == [1, 2, 3]
    assert mask.int().tolist() == [[1, 0, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1]]


# ---------------------------------------------------------------- the adapter leaves the target alone


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("prompt", ["none", "shallow", "deep"])
def test_ordinary_positions_score_the_same_with_and_without_the_adapter(arch, prompt):
    """The verify pass's logits at the pending token and the tree nodes do not move when mask groups and the
    prompt are appended; the mask positions' own logits do depend on the prompt."""
    model = varied_model(arch)
    drafter = BitaEfficientDrafter(adapter_for(model, prompt, scale=20.0), 2)
    target = CachedLM(model)
    draft_tokens = torch.tensor([[7, 9, 11, 13, 15, 17]])
    tree = drafter.tree
    positions = None
    outs = []
    for with_adapter in (False, True):
        target.start(PROMPT)
        from draftverify.engine.step import verify_layout
        from draftverify.types import Draft

        scoring = drafter.wrap_target(target) if with_adapter else target
        positions, mask = verify_layout(target, Draft(tokens=draft_tokens, tree=tree))
        out = scoring.forward(torch.cat([PROMPT[:, -1:], draft_tokens], 1), positions, mask)
        outs.append(out.logits)
    plain, adapted = outs
    assert adapted.shape[1] == plain.shape[1] + (tree.size + 1) * 3
    torch.testing.assert_close(adapted[:, : plain.shape[1]], plain, rtol=0, atol=forward_atol(model, plain))


def test_the_deep_prompt_reaches_the_mask_tokens():
    model = varied_model("llama")
    adapter = adapter_for(model, "deep", scale=50.0)
    ids, cut = PROMPT, torch.tensor([[6, 9]])
    with_prompt = mask_logits(model, adapter, ids, cut)
    without = mask_logits(model, adapter, ids, cut, prefix=tuple((k * 0 - 1e4, v) for k, v in adapter.prefix(model)))
    assert not torch.allclose(with_prompt, without)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("prompt", ["none", "shallow", "deep"])
def test_training_and_decoding_see_the_same_mask_logits(arch, prompt):
    """The trainer's mask logits after a cut k equal the first verify pass's after prefill of text[: k + 1]."""
    model = varied_model(arch)
    adapter = adapter_for(model, prompt, scale=10.0)
    k = 7
    with torch.no_grad():
        trained = mask_logits(model, adapter, PROMPT, torch.tensor([[k]]))[0, 0]  # [M, V]
    drafter = RecordingBita(adapter)
    generate(model, drafter, exact(), PROMPT[:, : k + 1], max_new_tokens=1)
    torch.testing.assert_close(drafter.seen[0][0, 1:].to(trained.dtype), trained, rtol=1e-6, atol=1e-6)


class RecordingBita(BitaDrafter):
    def __init__(self, adapter):
        super().__init__(adapter)
        self.seen = []

    def commit(self, state, verdict, scored=None):
        self.seen.append(scored.logits)  # [B, 1 + n + E, V]
        super().commit(state, verdict, scored)


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("method", list(MODES))
def test_bita_equals_target_greedy(arch, method):
    model, ref = target_and_reference(arch, PROMPT, NEW)
    cls, k = MODES[method]
    for prompt in ("none", "shallow", "deep"):
        out = generate(model, cls(adapter_for(model, prompt, seed=1), k), exact(), PROMPT, max_new_tokens=NEW)
        assert out.new_tokens[0].tolist() == ref, (method, prompt)
        assert out.stats.target_calls <= NEW


def test_a_self_predicting_target_accepts_whole_trees():
    """A target that always says token 0, and mask tokens that predict it: every step keeps M drafts + 1."""
    import copy

    model = copy.deepcopy(target_and_reference("llama", PROMPT, NEW)[0])
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, dtype=head.weight.dtype)
    with torch.no_grad():  # the same logits everywhere, mask positions included: token 0 first, then 1, 2, ...
        model.lm_head.weight.zero_()
        model.lm_head.bias.copy_(-torch.arange(head.out_features, dtype=head.weight.dtype))
    for method, (cls, k) in MODES.items():
        out = generate(model, cls(adapter_for(model), k), exact(), PROMPT, max_new_tokens=NEW)
        assert out.new_tokens[0].tolist() == [0] * NEW
        expected = (
            1 + NEW // 4 if method != "bita_chain" else 1 + 2 * NEW // 5
        )  # chain: 4 tokens, then 1 (no draft left)
        assert out.stats.target_calls <= expected, method


def test_a_preallocated_cache_gives_the_same_text():
    """The prompt's keys are prepended to a static cache's full window too (keys = prefix + capacity)."""
    model, ref = target_and_reference("qwen2", PROMPT, NEW)
    for method, (cls, k) in MODES.items():
        out = generate(
            CachedLM(model, capacity=96), cls(adapter_for(model, seed=2), k), exact(), PROMPT, max_new_tokens=NEW
        )
        assert out.new_tokens[0].tolist() == ref, method


@pytest.mark.parametrize("method", ["bita", "bita_tree", "bita_chain"])
def test_coupled_sampling_on_the_tree_gives_the_autoregressive_coupled_text(method):
    model, _ = target_and_reference("qwen2", PROMPT, NEW)
    params = SamplingParams(temperature=1.0, seed=3)
    alone = generate(model, NoDrafter(), exact(params), PROMPT, params, max_new_tokens=NEW)
    cls, k = MODES[method]
    out = generate(model, cls(adapter_for(model), k), exact(params), PROMPT, params, max_new_tokens=NEW)
    assert out.new_tokens.tolist() == alone.new_tokens.tolist()


def test_tree_sampling_follows_the_target():
    """Second token at temperature 1 (the first tree step, multi-draft speculative sampling): its law is the
    target's marginal sum_x p(x) p(y | x) whatever the mask tokens propose."""
    model, _ = target_and_reference("llama", PROMPT, NEW)
    adapter = adapter_for(model, seed=4, scale=30.0)
    with torch.no_grad():
        p1 = model(PROMPT).logits[0, -1].double().softmax(-1)  # [V]
        nexts = torch.cat([PROMPT.expand(p1.numel(), -1), torch.arange(p1.numel())[:, None]], 1)
        p2 = p1 @ model(nexts).logits[:, -1].double().softmax(-1)  # [V]
    draws, counts, accepted = 600, torch.zeros_like(p2), 0
    for seed in range(draws):
        params = SamplingParams(temperature=1.0, seed=seed, coupling=False)
        out = generate(model, BitaEfficientDrafter(adapter, 3), exact(params), PROMPT, params, max_new_tokens=2)
        counts[out.new_tokens[0, 1]] += 1
        accepted += out.stats.accepted_tokens
    assert accepted > draws // 40  # the tree was used, not only the fallback
    assert chi2_statistic(counts, p2.float()) < chi2_critical(counts, p2.float())


# ---------------------------------------------------------------- files, options, errors


def test_save_load_round_trip_methods_and_errors(tmp_path):
    model, ref = target_and_reference("llama", PROMPT, NEW)
    adapter = adapter_for(model, "shallow")
    adapter.save(tmp_path / "bita", metadata={"note": "test"})
    loaded = BitaAdapter.load(tmp_path / "bita")
    assert loaded.config == adapter.config
    torch.testing.assert_close(loaded.prompt_embeds, adapter.prompt_embeds.half().float())
    assert {"bita", "bita_tree", "bita_chain"} <= set(METHODS)
    options = MethodOptions(bita_path=tmp_path / "bita", bita_topk=2)
    for name in ("bita", "bita_tree", "bita_chain"):
        drafter = build_drafter(METHODS[name].drafter, CachedLM(model), options)
        out = generate(model, drafter, exact(), PROMPT, max_new_tokens=NEW)
        assert out.new_tokens[0].tolist() == ref
    fewer = build_drafter("bita", CachedLM(model), MethodOptions(bita_path=tmp_path / "bita", bita_masks=1))
    assert fewer.num_masks == 1 and fewer.tree.size == 3  # top-3 of one mask token
    assert generate(model, fewer, exact(), PROMPT, max_new_tokens=NEW).new_tokens[0].tolist() == ref
    with pytest.raises(DraftVerifyError, match="1..3 of this adapter's mask tokens"):
        build_drafter("bita", CachedLM(model), MethodOptions(bita_path=tmp_path / "bita", bita_masks=4))
    with pytest.raises(DraftVerifyError, match="needs a trained adapter"):
        build_drafter("bita", CachedLM(model), MethodOptions())
    with pytest.raises(DraftVerifyError, match="no BiTA adapter"):
        BitaAdapter.load(tmp_path)
    with pytest.raises(DraftVerifyError, match="another target"):
        generate(varied_model("qwen2"), BitaDrafter(loaded), exact(), PROMPT, max_new_tokens=2)
    with pytest.raises(DraftVerifyError, match="top-k"):
        BitaEfficientDrafter(loaded, 0)
    with pytest.raises(DraftVerifyError, match="decoder-only"):
        bart = varied_model("bart")
        generate(bart, BitaDrafter(BitaAdapter.for_target(varied_model("llama"))), exact(), PROMPT, max_new_tokens=2)
