"""Log-probabilities through the loop (engine/logprobs.py): every method reports, for the tokens it emits and for the
prompt, exactly what the target alone gives for the same text: log_softmax of the target's logits over the whole
sequence in one plain forward (no cache, no drafting), whatever was drafted, greedy or sampling, one row or rows that
join a running batch."""

from __future__ import annotations

import pytest
import torch

from conftest import left_padded, perturbed_copy, varied_model
from draftverify import DraftVerifyError, Logprobs, RowRequest, SamplingParams, generate
from draftverify.drafters import ModelDrafter, ModelTreeDrafter, NoDrafter, PromptLookupDrafter
from draftverify.verifiers.exact import ExactVerifier

PROMPTS = [[5, 17, 33, 8, 41, 5, 17, 33], [9, 4], [60, 61, 62, 60, 61], [12]]
NEW = 16
TOP = 3

_models: dict = {}


def model_for(arch: str = "llama"):
    if arch not in _models:
        _models[arch] = varied_model(arch)
    return _models[arch]


def drafter_for(kind: str, model):
    if kind == "none":
        return NoDrafter()
    if kind == "prompt_lookup":
        return PromptLookupDrafter(max_ngram=3)
    if kind == "model":
        return ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    if kind == "model_tree":
        return ModelTreeDrafter(perturbed_copy(model, 0.5, seed=1))
    raise ValueError(kind)


@torch.no_grad()
def target_alone(model, prompt: list[int], new: list[int]) -> torch.Tensor:
    """The target's log-probabilities over prompt + new in one forward [len - 1, V]: row p scores token p + 1."""
    ids = torch.tensor([prompt + new])
    return model(input_ids=ids).logits[0, :-1].double().log_softmax(dim=-1)


def assert_matches(model, prompt: list[int], new: list[int], row, top: int, prompt_too: bool) -> None:
    """A row's reported log-probabilities equal the target alone's at each position, chosen and top listed."""
    expected = target_alone(model, prompt, new)  # [len - 1, V]
    entries = (row.prompt if prompt_too else []) + row.tokens
    tokens = (prompt[1:] if prompt_too else []) + new
    first = 0 if prompt_too else len(prompt) - 1
    assert [e.token for e in entries] == tokens
    assert row.prompt is None if not prompt_too else len(row.prompt) == len(prompt) - 1
    for j, entry in enumerate(entries):
        at = expected[first + j]
        assert entry.logprob == pytest.approx(float(at[entry.token]), abs=1e-6)
        assert len(entry.top) == top
        values, ids = at.topk(top)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-6)
        if entry.top and entry.token == entry.top[0][0]:
            assert entry.logprob == entry.top[0][1]  # the same float: lm-eval's is_greedy compares them with ==


SETTINGS = {"greedy": SamplingParams(), "sampling": SamplingParams(temperature=0.9, top_p=0.95, seed=7)}


@pytest.mark.parametrize("kind", ["none", "prompt_lookup", "model", "model_tree"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_one_row_reports_the_target_alone_logprobs(kind, setting):
    model = model_for()
    params = SETTINGS[setting]
    prompt = PROMPTS[0]
    out = generate(
        model,
        drafter_for(kind, model),
        ExactVerifier(params),
        torch.tensor([prompt]),
        params,
        max_new_tokens=NEW,
        gamma=4,
        logprobs=Logprobs(top=TOP, prompt=True),
    )
    new = out.new_tokens[0].tolist()
    assert_matches(model, prompt, new, out.logprobs[0], TOP, prompt_too=True)
    alone = generate(
        model,
        NoDrafter(),
        ExactVerifier(params),
        torch.tensor([prompt]),
        params,
        max_new_tokens=NEW,
        logprobs=Logprobs(top=TOP, prompt=True),
    )
    assert alone.new_tokens[0].tolist() == new  # the same text, so the same positions to compare
    for ours, its in zip(
        out.logprobs[0].prompt + out.logprobs[0].tokens, alone.logprobs[0].prompt + alone.logprobs[0].tokens
    ):
        assert ours.token == its.token and ours.logprob == pytest.approx(its.logprob, abs=1e-6)


@pytest.mark.parametrize("kind", ["prompt_lookup", "model"])
def test_rows_and_joining_rows_report_what_each_asked(kind):
    """A batch whose rows ask for different things (nothing, top 2 without the prompt, the prompt with top 0), and
    rows that join it between steps with their own asks: each gets the target alone's numbers for its own text."""
    model = model_for()
    asks = [Logprobs(top=2), None, Logprobs(prompt=True), Logprobs(top=4, prompt=True)]
    ids, mask = left_padded(PROMPTS[:2])
    pending = [[RowRequest(PROMPTS[2], NEW, logprobs=asks[2])], [], [RowRequest(PROMPTS[3], 6, logprobs=asks[3])]]
    steps = []
    out = generate(
        model,
        drafter_for(kind, model),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        gamma=3,
        logprobs=asks[:2],
        admit=lambda: pending.pop(0) if pending else [],
        on_step=lambda record, rows: steps.append((record.logprobs, record.prompt_logprobs, list(rows))),
    )
    assert out.logprobs[1] is None
    for row in (0, 2, 3):
        ask = asks[row]
        assert_matches(model, PROMPTS[row], out.rows[row], out.logprobs[row], ask.top, ask.prompt)
    # the steps' records carry the same entries, in order, per row
    streamed: dict[int, list] = {0: [], 2: [], 3: []}
    prompts: dict[int, list] = {}
    for logprobs, prompt_logprobs, rows in steps:
        for i, row in enumerate(rows):
            if logprobs[i] is not None:
                streamed[row].extend(logprobs[i])
            if prompt_logprobs is not None and prompt_logprobs[i] is not None:
                prompts[row] = prompt_logprobs[i]
    assert {row: streamed[row] for row in streamed} == {row: out.logprobs[row].tokens for row in streamed}
    assert prompts == {2: out.logprobs[2].prompt, 3: out.logprobs[3].prompt}
    assert prompts[3] == []  # a one-token prompt has nothing before its first token


def test_bad_asks_are_clear_errors():
    model = model_for()
    with pytest.raises(DraftVerifyError, match="top must be an integer >= 0"):
        Logprobs(top=-1)
    with pytest.raises(DraftVerifyError, match="2 entries for 1 rows"):
        generate(model, NoDrafter(), ExactVerifier(SamplingParams()), torch.tensor([PROMPTS[0]]), logprobs=[None, None])
    with pytest.raises(DraftVerifyError, match="Logprobs or None"):
        RowRequest([1, 2], 4, logprobs=3)
    seq2seq = varied_model("t5")
    with pytest.raises(DraftVerifyError, match="decoder-only target"):
        generate(
            seq2seq,
            NoDrafter(),
            ExactVerifier(SamplingParams()),
            torch.tensor([PROMPTS[0]]),
            logprobs=Logprobs(prompt=True),
        )
