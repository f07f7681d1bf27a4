"""The logits processors, one verify pass at a time: each position processed with the tokens it follows (a chain's
earlier draft tokens, a tree node's ancestors), checked against processing each position alone from scratch; the
first-token constraint of healing; the cut of draft tokens a mask forbids, with the drafter's q renormalised."""

from __future__ import annotations

import pytest
import torch

from draftverify import DraftVerifyError
from draftverify.engine.processors import FirstTokenAllowed, Processors, Step, allowed_ids
from draftverify.processing import Processing, ProcessingError, Structured
from draftverify.tree import TreeSpec
from draftverify.types import DecodingState, Draft, SamplingParams
from processing_reference import processed_row

VOCAB = 8
EOS = 7


def logits(batch: int = 2, width: int = 3) -> torch.Tensor:
    return torch.arange(batch * width * VOCAB, dtype=torch.float).reshape(batch, width, VOCAB)  # [B, 1+N, V]


def state_of(prompts: list[list[int]]) -> DecodingState:
    width = max(len(p) for p in prompts)
    tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    lengths = torch.tensor([len(p) for p in prompts])
    return DecodingState(tokens, None, width, SamplingParams(), None, lengths=lengths)


def holder(batch: int, allowed=None, processing=None, prompts=None) -> Processors:
    made = Processors(VOCAB, {EOS}, torch.device("cpu"))
    made.add(made.check(processing, allowed, batch), prompts or [[1]] * batch)
    return made


def chain(batch: int, n: int) -> Draft:
    return Draft(tokens=torch.zeros(batch, n, dtype=torch.long))


# ---- the first token of a healed prompt ---------------------------------------------------------------------------
def test_no_constraint_passes_the_logits_through_untouched():
    given = logits()
    assert holder(2)(given, state_of([[1], [1]]), chain(2, 2)) is given
    assert holder(2, [None, None])(given, state_of([[1], [1]]), chain(2, 2)) is given  # no row constrained


def test_one_set_for_every_row_masks_position_zero_only_and_only_once():
    given = logits()
    first = holder(2, torch.tensor([1, 5]))
    state, draft = state_of([[1], [1]]), Draft(tokens=torch.tensor([[1, 2], [5, 1]]))
    draft = first.cut(draft, state)
    out = first(given, state, draft)
    for b in range(2):
        allowed = torch.isfinite(out[b, 0])
        assert allowed.nonzero().flatten().tolist() == [1, 5]
        assert torch.equal(out[b, 0, [1, 5]], given[b, 0, [1, 5]])
    assert torch.equal(out[:, 1:], given[:, 1:])  # later positions are never constrained
    assert torch.isfinite(given).all()  # the target's own logits are left alone (a copy is masked)
    first.commit([[1], [5]])
    assert first(given, state, draft) is given  # spent: later passes go through


def test_rows_without_a_set_stay_free():
    state, draft = state_of([[1], [1]]), chain(2, 2)
    made = holder(2, [[2], None])
    out = made(logits(), state, made.cut(draft, state))
    assert torch.isfinite(out[0, 0]).sum() == 1 and torch.isfinite(out[1, 0]).all()


def test_joining_rows_take_their_own_sets_at_the_next_pass():
    made = holder(1)
    made.add(made.check(None, [None], 1), [[1]])
    assert made.present == [] and made.rows == 2  # nothing constrained: no processor made
    made.add(made.check(None, [[3, 4], None], 2), [[1], [1]])  # two rows join
    first = made.present[0]
    assert isinstance(first, FirstTokenAllowed)
    assert [None if a is None else a.tolist() for a in first.rows] == [None, None, [3, 4], None]
    state, draft = state_of([[1]] * 4), chain(4, 2)
    out = made(logits(4), state, made.cut(draft, state))
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[3, 0]).all()
    assert torch.isfinite(out[2, 0]).nonzero().flatten().tolist() == [3, 4]


@pytest.mark.parametrize(
    "allowed, message", [([], "is empty"), ([VOCAB], r"must be in \[0, 8\)"), ([-1], "must be in")]
)
def test_bad_sets_are_refused(allowed, message):
    with pytest.raises(DraftVerifyError, match=message):
        allowed_ids(allowed, VOCAB)
    with pytest.raises(DraftVerifyError, match=message):
        holder(1, [allowed])


def test_one_entry_per_row():
    with pytest.raises(DraftVerifyError, match="first_token_allowed has 1 entries for 2 rows"):
        holder(2, [[1]])
    with pytest.raises(DraftVerifyError, match="processing has 1 entries for 2 rows"):
        holder(2, processing=[Processing()])


# ---- what each position follows -----------------------------------------------------------------------------
def test_a_step_knows_the_draft_tokens_each_position_follows():
    step = Step(chain(1, 3))
    assert step.follows.long().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert step.depth.tolist() == [0, 1, 2, 3] and step.node_position.tolist() == [0, 1, 2]
    tree = TreeSpec.from_parents([-1, -1, 0, 2])  # two children of the root; node 2 under node 0, node 3 under 2
    step = Step(Draft(tokens=torch.zeros(1, 4, dtype=torch.long), tree=tree))
    assert step.follows.long().tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    assert step.depth.tolist() == [0, 1, 1, 2, 3] and step.node_position.tolist() == [0, 0, 1, 3]
    assert step.at([0, 3]).follows.long().tolist() == [[0, 0, 0, 0], [1, 0, 1, 0]]


# ---- penalties, bias, min_tokens: each position as decoding token by token would see it --------------------------
@pytest.mark.parametrize("shape", ["chain", "tree", "ragged"])
def test_every_position_is_processed_with_the_tokens_it_follows(shape):
    gen = torch.Generator().manual_seed(0)
    settings = [
        Processing(repetition_penalty=1.7, frequency_penalty=0.6, presence_penalty=0.4, logit_bias={2: 1.5, 5: -3}),
        Processing(frequency_penalty=-0.5, min_tokens=4, stop_token_ids=[6]),
        Processing(),
    ]
    prompts = [[1, 2, 3], [4, 4], [5]]
    generated = [[2, 2, 6], [1], []]  # committed before this step
    if shape == "tree":
        tree = TreeSpec.from_parents([-1, 0, 0, -1, 3, 1])
        draft = Draft(tokens=torch.tensor([[2, 3, 2, 5, 2, 3], [1, 1, 4, 6, 6, 1], [5, 5, 5, 5, 5, 5]]), tree=tree)
        before = [[], [0], [0], [], [3], [0, 1]]  # each node's ancestors (the path to it, itself excluded)
    else:
        draft = Draft(tokens=torch.tensor([[2, 3, 2, 2], [1, 6, 6, 1], [5, 5, 0, 0]]))
        if shape == "ragged":
            draft.lengths = torch.tensor([4, 3, 2])
        before = [list(range(j)) for j in range(4)]
    made = holder(3, processing=settings, prompts=prompts)
    state = state_of([p + g for p, g in zip(prompts, generated)])
    made.commit(generated)
    kept = made.cut(draft, state)  # row 1's stop token 6 comes too early in the chain: cut there
    given = torch.randn(3, 1 + kept.length, VOCAB, generator=gen, dtype=torch.float64) * 3
    out = made(given, state, kept)
    for b in range(3):
        stops = settings[b].stops({EOS})
        for position in range(out.shape[1]):
            path = [] if position == 0 else before[position - 1] + [position - 1]
            if kept.lengths is not None and position > int(kept.lengths[b]):
                continue  # past the row's own draft: never read
            follows = [int(draft.tokens[b, j]) for j in path]
            want = processed_row(given[b, position], prompts[b], generated[b] + follows, settings[b], stops)
            assert torch.allclose(out[b, position], want, atol=1e-12), (b, position)


def test_min_tokens_cuts_a_stop_token_drafted_too_early_and_renormalises_q():
    made = holder(1, processing=Processing(min_tokens=2))
    q = torch.full((1, 3, VOCAB), 1.0 / VOCAB)
    draft = Draft(tokens=torch.tensor([[4, EOS, 5]]), q_probs=q)
    kept = made.cut(draft, state_of([[1]]))
    assert kept.tokens.tolist() == [[4]] and kept.lengths is None  # cut before the early EOS: the target never sees it
    assert kept.q_probs.shape == (1, 1, VOCAB)
    assert kept.q_probs[0, 0, EOS] == 0 and torch.allclose(kept.q_probs.sum(-1), torch.ones(1, 1, dtype=q.dtype))
    made.commit([[4, 4]])
    assert made.cut(draft, state_of([[1, 4, 4]])) is draft  # min_tokens reached: nothing is cut any more


def test_a_tree_keeps_its_shape_and_loses_the_forbidden_subtrees():
    tree = TreeSpec.from_parents([-1, 0, -1, 2])
    made = holder(2, processing=Processing(min_tokens=2))
    draft = Draft(tokens=torch.tensor([[EOS, 3, 4, EOS], [4, 5, 6, 1]]), tree=tree)
    kept = made.cut(draft, state_of([[1], [1]]))
    assert kept.tree is tree and kept.tokens is draft.tokens
    assert kept.valid.tolist() == [[False, False, True, False], [True, True, True, True]]


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"logit_bias": {3: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": True}, "min_tokens"),
        ({"stop_token_ids": "7"}, "stop_token_ids"),
        ({"stop_token_ids": [1.5]}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_bad_settings_name_their_field(fields, field):
    with pytest.raises(ProcessingError) as err:
        Processing(**fields)
    assert err.value.field == field and str(err.value).startswith(field)


def test_token_ids_must_be_the_models():
    with pytest.raises(ProcessingError, match="logit_bias: token id 8 is not in this model's vocabulary"):
        holder(1, processing=Processing(logit_bias={8: 1.0}))
    with pytest.raises(ProcessingError, match="stop_token_ids: token id 9"):
        holder(1, processing=Processing(stop_token_ids=[9]))
    with pytest.raises(ProcessingError, match="compile it for the model's tokenizer first"):
        holder(1, processing=Processing(structured=Structured(regex="a+")))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "exactly one of"),
        ({"regex": "a", "grammar": "root ::= 'a'"}, "got regex, grammar"),
        ({"choice": "ab"}, "non-empty list of strings"),
        ({"choice": []}, "exactly one of|non-empty"),
        ({"json_schema": "{nope"}, "not valid JSON"),
        ({"json_schema": [1]}, "must be a JSON object"),
        ({"regex": 5}, "must be a string"),
    ],
)
def test_a_structured_constraint_is_one_of_its_kinds(fields, message):
    with pytest.raises(ProcessingError, match=message):
        Structured(**fields)


def test_stops_are_eos_unless_ignored_and_the_rows_own():
    assert Processing().stops({7}) == {7}
    assert Processing(ignore_eos=True, stop_token_ids=[2]).stops({7}) == {2}
    assert Processing(stop_token_ids=(2, 3)).stops({7}) == {2, 3, 7}


def test_a_position_the_masks_leave_empty_allows_the_stop_tokens():
    """min_tokens forbids EOS where the first token may only be EOS (healing's set, say): the text ends there."""
    made = holder(2, [[EOS], None], processing=Processing(min_tokens=3))
    state, draft = state_of([[1], [1]]), chain(2, 0)
    out = made(logits(2, 1), state, made.cut(draft, state))
    assert torch.isfinite(out[0, 0]).nonzero().flatten().tolist() == [EOS]
    assert torch.isfinite(out[1, 0]).sum() == VOCAB - 1  # the other row: EOS forbidden, the rest as they were
