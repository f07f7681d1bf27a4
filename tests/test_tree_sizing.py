"""Sizing a draft tree by measured costs (tree_sizing.py): rates never rise down a branch, every size is a valid
subtree, a flat verify cost keeps the whole shape and a steep one keeps only the likely nodes; model_tree stays
exact while it sizes."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from conftest import perturbed_copy, target_and_reference
from draftverify import SamplingParams, generate
from draftverify.draft_length import StepCosts
from draftverify.drafters import ModelTreeDrafter
from draftverify.drafters.model_tree import DEFAULT_TREE_PATHS
from draftverify.methods import MethodOptions, build_verifier
from draftverify.tree import TreeSpec
from draftverify.tree_sizing import NodeRates, best_subtree
from draftverify.types import DecodingState

TREE = TreeSpec.from_paths(DEFAULT_TREE_PATHS)
DEPTH = TREE.depth.tolist()
PARENTS = TREE.parents.tolist()


def measured(hits: dict[int, int], steps: int) -> NodeRates:
    rates = NodeRates(TREE)
    for step in range(steps):
        accepted = [j for j, h in hits.items() if step < h]
        rates.record(range(TREE.size), accepted)
    return rates


def test_rates_follow_the_counts_never_rise_down_a_branch_and_guess_half_the_parent_when_unmeasured():
    rates = measured({0: 90, 3: 80, 6: 70, 9: 60}, steps=100).rates()  # the chain (0,), (0,0), ... mostly accepted
    assert abs(rates[0] - (90 + 1) / 102) < 1e-9  # hits + prior 2 x 0.5, over trials + 2
    assert all(rates[j] <= rates[p] + 1e-12 for j, p in enumerate(PARENTS) if p >= 0)
    assert rates[1] < 0.02 and rates[9] > 0.5
    fresh = NodeRates(TREE).rates()
    assert fresh[0] == 0.5 and fresh[3] == 0.25  # (0,) then (0, 0): half the parent's


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=TREE.size, max_size=TREE.size), st.floats(0.0, 1.0), st.floats(0.0, 3.0))
def test_every_size_is_a_subtree_with_its_parents(raw, level, slope):
    rates: list[float] = []
    for j, p in enumerate(PARENTS):  # any rates that never rise down a branch
        rates.append(raw[j] * (1.0 if p < 0 else rates[p]))
    nodes = best_subtree(rates, DEPTH, level, lambda n: 1.0 + slope * (n - 1))
    assert nodes and nodes == sorted(nodes)
    assert all(PARENTS[j] < 0 or PARENTS[j] in nodes for j in nodes)


def test_a_flat_verify_cost_keeps_the_shape_and_a_steep_one_only_the_likely_branch():
    rates = measured({0: 90, 1: 5, 2: 2, 3: 80, 4: 4, 5: 1, 6: 70, 7: 3, 8: 2, 9: 60}, steps=100).rates()
    flat = best_subtree(rates, DEPTH, 0.01, lambda n: 1.0)  # a GPU: 11 tokens cost what one does
    assert flat == list(range(TREE.size))
    steep = best_subtree(rates, DEPTH, 0.01, lambda n: 1.0 + 0.3 * (n - 1))  # a CPU: each token costs 0.3 of one
    assert steep == [0, 3, 6, 9]  # the chain along the accepted branch
    assert best_subtree(rates, DEPTH, 0.01, lambda n: 1.0 + 0.3 * (n - 1), allowed=[0, 1, 2, 3, 4, 5]) == [0, 3]


def steep_costs() -> StepCosts:
    costs = StepCosts()
    for drafted in (1, 4, 9, 1, 4, 9):  # the first call of each shape is skipped
        costs.record(drafted, 0.001, 1.0 + 0.3 * drafted)
    return costs


def test_model_tree_sizes_its_tree_from_the_costs_it_is_given_and_stays_exact():
    prompt = torch.tensor([[5, 17, 42, 8, 5, 17, 42, 8, 5]])
    model, ref = target_and_reference("llama", prompt, 24)
    drafter = ModelTreeDrafter(perturbed_copy(model, 0.3, seed=1))
    state = DecodingState(
        tokens=prompt,
        source_ids=None,
        prompt_length=prompt.shape[1],
        params=SamplingParams(),
        generator=None,
        costs=steep_costs(),
    )
    assert drafter.nodes_for(state, 4) == list(range(TREE.size))  # no draft forward timed yet: the whole shape
    drafter.level_seconds = 0.01
    drafter.rates = measured({0: 90, 3: 80, 6: 70, 9: 60}, steps=100)
    assert drafter.nodes_for(state, 4) == [0, 3, 6, 9]
    assert drafter.subtree([0, 3, 6, 9]).retrieve_indices.tolist() == [[0, 1, 2, 3]]  # a chain of 4

    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(model, drafter, verifier, prompt, max_new_tokens=24, gamma="auto")
    assert out.new_tokens[0].tolist() == ref
    assert sum(drafter.rates.trials) > 0  # it measured the nodes it proposed


def test_with_one_verify_width_timed_the_drafter_alternates_its_main_chain_to_measure_the_slope():
    """A fixed shape scores one width every step, so the fitted cost curve has no slope (flat: the whole shape
    always wins). Until a second width is timed, every other step verifies the main chain instead."""
    one_width = StepCosts()
    for _ in range(3):
        one_width.record(10, 0.001, 2.0)
    assert one_width.known and not one_width.slope_known and not StepCosts().slope_known
    assert steep_costs().slope_known
    prompt = torch.tensor([[5, 17, 42, 8]])
    drafter = ModelTreeDrafter(target_and_reference("llama", prompt, 1)[0])
    drafter.level_seconds = 0.01
    state = DecodingState(
        tokens=prompt, source_ids=None, prompt_length=4, params=SamplingParams(), generator=None, costs=one_width
    )
    sizes = [drafter.nodes_for(state, 4) for _ in range(4)]
    assert sizes == [[0, 3, 6, 9], list(range(TREE.size))] * 2
    assert drafter.nodes_for(state, 2) in ([0, 3], [0, 1, 2, 3, 4, 5])  # the depth cap still holds


def test_only_a_policy_that_chooses_the_length_itself_hands_its_costs_to_the_drafter():
    from draftverify.draft_length import AutoGamma, ConfidenceGamma, FixedGamma

    assert AutoGamma().sizing_costs is not None and ConfidenceGamma().sizing_costs is not None
    assert FixedGamma(4).sizing_costs is None and ConfidenceGamma(fixed=4).sizing_costs is None
