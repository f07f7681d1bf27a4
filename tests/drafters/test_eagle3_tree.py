"""eagle3_tree: the EAGLE-3 head expands EAGLE-2's dynamic tree; exact under greedy and sampling, each node drafted
from its own branch only (the head's tree mask), and its options refused in one line when out of range."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from conftest import (
    CAUSAL_ARCHS,
    PlainStepsBetween,
    build_model,
    chi2_critical,
    chi2_statistic,
    reference_greedy,
    varied_model,
)
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.cli import app
from draftverify.drafters.base import NoDrafter
from draftverify.drafters.eagle3 import Eagle3Drafter
from draftverify.drafters.eagle3_head import HeadCache
from draftverify.drafters.eagle3_tree import Eagle3TreeDrafter
from draftverify.methods import METHODS, MethodOptions, build_drafter
from draftverify.sampling import probs_from_logits
from eagle3_heads import exact, head_for, trained_head

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
@pytest.mark.parametrize("gamma", [4, "auto", "conf"])
def test_the_tree_gives_the_targets_greedy_text(arch, gamma):
    """Every architecture, a fixed depth and the cost-sized tree (gamma auto / conf)."""
    model = varied_model(arch)
    reference = reference_greedy(model, PROMPT, NEW)
    out = generate(model, Eagle3TreeDrafter(head_for(model)), exact(), PROMPT, max_new_tokens=NEW, gamma=gamma)
    assert out.new_tokens[0].tolist() == reference


def test_a_trained_heads_tree_is_accepted_and_one_child_per_node_is_the_chain():
    """top_k 1 makes the tree the chain the eagle3 drafter drafts: the same steps exactly. A wider tree keeps the
    text and is accepted about as far."""
    model = varied_model("llama")
    reference = reference_greedy(model, PROMPT, NEW)
    head = trained_head(model, [PROMPT[0].tolist()], NEW, steps=60)
    chain = generate(model, Eagle3Drafter(head), exact(), PROMPT, max_new_tokens=NEW, gamma=4).stats
    single = generate(model, Eagle3TreeDrafter(head, top_k=1), exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert single.new_tokens[0].tolist() == reference
    assert (single.stats.target_calls, single.stats.accepted_tokens) == (chain.target_calls, chain.accepted_tokens)
    wide = generate(model, Eagle3TreeDrafter(head, top_k=3, nodes=40), exact(), PROMPT, max_new_tokens=NEW, gamma=4)
    assert wide.new_tokens[0].tolist() == reference
    assert wide.stats.accepted_tokens >= chain.accepted_tokens > NEW // 2


class BranchCheck(Eagle3TreeDrafter):
    """After each proposal, drafts every expanded node's path again as a plain chain from the same head cache and
    checks the node's children are among that chain's top-k: nothing of a sibling branch reached it."""

    checked = 0
    STATE = ("_real", "_features", "_counts", "_kept", "forward_calls")  # what a proposal changes

    def snapshot(self) -> tuple:
        return (self.cache.k, self.cache.v, *(getattr(self, name) for name in self.STATE))

    def restore(self, saved: tuple) -> None:
        self.cache = HeadCache()
        self.cache.k, self.cache.v = saved[:2]
        for name, value in zip(self.STATE, saved[2:]):
            setattr(self, name, value)

    def propose(self, state, gamma):
        before = self.snapshot()
        draft = super().propose(state, gamma)
        after = self.snapshot()
        if draft.tree is not None:
            tokens, parents = draft.tokens[0].tolist(), draft.tree.parents.tolist()
            for j in range(draft.tree.size):
                children = [tokens[c] for c in range(j + 1, len(parents)) if parents[c] == j]
                if children:
                    path = [tokens[a] for a in draft.tree.ancestor_mask[j].nonzero().flatten().tolist()]
                    assert set(children) <= set(self.chain_top_k(state, before, path)), (j, path)
                    BranchCheck.checked += 1
        self.restore(after)
        return draft

    def chain_top_k(self, state, before, path: list[int]) -> list[int]:
        self.restore(before)
        prenorm, end = self.catch_up(state)
        for i, token in enumerate(path):
            embeds = self.embed(torch.tensor([[token]]))
            prenorm = self.head.step(self.cache, embeds, prenorm, (end + i)[:, None])
        logits = self.head.logits(prenorm[0], self.lm_head)
        return probs_from_logits(logits, state.params).topk(self.top_k, dim=-1).indices[0].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_node_is_drafted_from_its_own_branch(arch):
    model = varied_model(arch)
    reference = reference_greedy(model, PROMPT, 16)
    BranchCheck.checked = 0
    out = generate(model, BranchCheck(head_for(model), top_k=3, nodes=20), exact(), PROMPT, max_new_tokens=16, gamma=3)
    assert out.new_tokens[0].tolist() == reference
    assert BranchCheck.checked > 10  # second-level and deeper branches were checked, not only the root's


def test_plain_steps_between_trees_stay_exact():
    model = varied_model("llama")
    reference = reference_greedy(model, PROMPT, NEW)
    out = generate(
        model, Eagle3TreeDrafter(head_for(model)), exact(), PROMPT, max_new_tokens=NEW, gamma=PlainStepsBetween()
    )
    assert out.new_tokens[0].tolist() == reference and out.stats.gammas[2] == 0


def test_coupled_sampling_on_the_tree_gives_the_autoregressive_coupled_text():
    model = varied_model("llama")
    params = SamplingParams(temperature=1.0, seed=11)
    alone = generate(model, NoDrafter(), exact(params), PROMPT, params, max_new_tokens=NEW)
    head = trained_head(model, [PROMPT[0].tolist()], NEW, steps=40)
    tree = generate(model, Eagle3TreeDrafter(head), exact(params), PROMPT, params, max_new_tokens=NEW, gamma=3)
    assert tree.new_tokens.tolist() == alone.new_tokens.tolist()
    assert tree.stats.accepted_tokens > 0


VOCAB = 10  # 100 cells in the joint of two tokens
SAMPLE_PROMPT = torch.tensor([[5, 7, 2, 9, 5, 7]])
RUNS = 1000  # a resample-from-p mistake in the tree rule fails at this size (checked by hand)


@torch.no_grad()
def exact_joint(target, params: SamplingParams) -> torch.Tensor:
    """p(x1, x2) [V, V] from the target's own probabilities."""
    first = probs_from_logits(target(SAMPLE_PROMPT).logits[0, -1], params)  # [V]
    contexts = torch.cat([SAMPLE_PROMPT.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)  # [V, L+1]
    second = probs_from_logits(target(contexts).logits[:, -1], params)  # [V, V]
    return (first[:, None] * second).double()


def test_the_first_two_sampled_tokens_are_distributed_as_the_target():
    """Multi-draft speculative sampling (no coupling) over the head's trees: the joint law of the first two new
    tokens over RUNS seeds against the target's exact p(x1) p(x2 | x1), chi-square at the 0.001 level."""
    target = build_model("llama", layers=3, seed=0, vocab=VOCAB).float()
    head = head_for(target, seed=2).float()
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    accepted = rejected = 0
    for seed in range(RUNS):
        params = SamplingParams(temperature=1.0, seed=seed, coupling=False)
        drafter = Eagle3TreeDrafter(head, top_k=2, nodes=4)
        out = generate(target, drafter, exact(params), SAMPLE_PROMPT, params, max_new_tokens=2, gamma=2)
        x1, x2 = out.new_tokens[0].tolist()
        counts[x1, x2] += 1
        accepted, rejected = accepted + out.stats.accepted_tokens, rejected + out.stats.rejections
    assert accepted > 0 and rejected > 0  # both sides of the rule ran
    p = exact_joint(target, SamplingParams(temperature=1.0))
    assert chi2_statistic(counts.flatten(), p.flatten()) < chi2_critical(counts.flatten(), p.flatten())


def test_the_method_is_registered_with_its_options():
    method = METHODS["eagle3_tree"]
    assert method.drafter == "eagle3_tree" and method.lossless and not method.batches
    assert Eagle3TreeDrafter.proposes_trees and Eagle3TreeDrafter(head_for(varied_model("llama"))).verify_width(4) == 17


@pytest.mark.parametrize(("name", "value"), [("eagle3_top_k", 0), ("eagle3_nodes", -1), ("eagle3_top_k", 2.5)])
def test_bad_option_values_are_refused_before_the_head_loads(name, value, tmp_path):
    options = MethodOptions(eagle3_path=tmp_path / "no head here", **{name: value})
    with pytest.raises(DraftVerifyError, match=f"API: {name}\\) to be a whole number >= 1"):
        build_drafter("eagle3_tree", CachedLM(varied_model("llama")), options)


@pytest.mark.parametrize(("flag", "value"), [("--eagle3-topk", "0"), ("--eagle3-nodes", "0")])
def test_the_cli_refuses_a_bad_value_in_one_line_with_exit_2(flag, value):
    result = CliRunner().invoke(
        app, ["generate", "--zoo", "code", "--method", "eagle3_tree", flag, value, "--prompt", "x", "-n", "2"]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and flag in lines[0] and "whole number >= 1" in lines[0]
