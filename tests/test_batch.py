"""Batches of several rows in the one decoding loop: prompts of different lengths (left padding), ragged acceptance,
per-row EOS / max_new_tokens, rows leaving the batch. Every row must equal its own batch-1 output."""

from __future__ import annotations

import pytest
import torch

from conftest import (
    VOCAB,
    chi2_critical,
    chi2_statistic,
    left_padded,
    perturbed_copy,
    reference_greedy as _reference_greedy,
    varied_model,
)
from draftverify import DraftVerifyError, RowRequest, SamplingParams, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.draft_length import AutoGamma
from draftverify.drafters import (
    EarlyExitDrafter,
    LookupModelDrafter,
    ModelDrafter,
    NgramDrafter,
    NgramTable,
    NoDrafter,
    PromptLookupDrafter,
)
from draftverify.sampling import probs_from_logits
from draftverify.verifiers import GreedyVerifier, GumbelCouplingVerifier, SpeculativeSamplingVerifier
from draftverify.verifiers.exact import ExactVerifier

PROMPTS = [[5, 17, 33, 8, 41, 5, 17], [9, 4], [60, 61, 62, 60, 61], [12]]
NEW = 24

_models: dict = {}


def model_for(arch: str):
    if arch not in _models:
        _models[arch] = varied_model(arch)
    return _models[arch]


_refs: dict = {}


def reference_greedy(model, prompt: torch.Tensor, new: int, eos: int | None = None) -> list[int]:
    """conftest's reference, computed once per (model, prompt, length, eos): it recomputes every step from scratch."""
    key = (id(model), tuple(prompt.flatten().tolist()), new, eos)
    if key not in _refs:
        _refs[key] = _reference_greedy(model, prompt, new, eos)
    return _refs[key]


def make_drafter(kind: str, model, refs: list[list[int]]):
    if kind == "none":
        return NoDrafter()
    if kind == "model":
        return ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    if kind == "prompt_lookup":
        return PromptLookupDrafter(max_ngram=3)
    if kind == "ngram":  # half of each answer: rows accept different amounts
        corpus = [p + r[: len(r) // 2] for p, r in zip(PROMPTS, refs)] + [list(range(VOCAB))]
        return NgramDrafter(NgramTable.from_sequences(corpus, order=3, vocab_size=VOCAB))
    if kind == "early_exit":
        return EarlyExitDrafter(model, num_layers=1)
    if kind == "lookup_model":
        return LookupModelDrafter(perturbed_copy(model, 0.5, seed=1), max_ngram=3, min_ngram=1)
    raise ValueError(kind)


KINDS = ["none", "model", "prompt_lookup", "ngram", "lookup_model"]
GRID = [(arch, kind) for arch in ("llama", "gpt2") for kind in KINDS] + [
    ("qwen2", "model"),
    ("gpt_neox", "model"),
    ("llama", "early_exit"),
    ("gpt2", "early_exit"),
]


@pytest.mark.parametrize("arch, kind", GRID)
def test_every_row_equals_its_own_greedy_text(arch, kind):
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    assert len({tuple(r) for r in refs}) == len(refs)
    ids, mask = left_padded(PROMPTS)
    seen: list[torch.Tensor] = []
    out = generate(
        model,
        make_drafter(kind, model, refs),
        GreedyVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=3,
        on_tokens=seen.append,
    )
    assert out.rows == refs
    assert out.stats.new_tokens == sum(limits)
    # the streamed tokens, row by row without the -1 padding, are the output
    streamed = [[t for step in seen for t in step[b].tolist() if t >= 0] for b in range(len(PROMPTS))]
    assert streamed == refs and all(step.shape[0] == len(PROMPTS) for step in seen)
    for b, r in enumerate(refs):
        assert out.new_tokens[b, : len(r)].tolist() == r and (out.new_tokens[b, len(r) :] == -1).all()
    if kind in ("model", "ngram", "lookup_model", "early_exit"):
        assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # partial, ragged acceptance


class ComputeBoundTimings(AutoGamma):
    """gamma auto fed the timings of a fully compute-bound target (seconds proportional to the tokens a call scores,
    drafting free) instead of this machine's: no draft pays, so once a step is timed it decodes plainly (gamma 0),
    with a one-token probe every probe_every steps (min_evidence 0: plain decoding from the first timed step, the
    switching is what these tests exercise)."""

    def __init__(self) -> None:
        super().__init__(min_evidence=0)

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds, rows=1):
        super().update(drafted, accepted, rejected, 0.0, 0.001 * rows * (drafted + 1), rows)


@pytest.mark.parametrize("kind", ["model", "lookup_model"])
def test_gamma_auto_rows_equal_their_own_greedy_text(kind):
    """gamma auto in a batch (rows leaving as they finish): with this machine's timings, and with timings that make
    it switch between drafting, plain steps (gamma 0) and probes, every row is still its own greedy text."""
    model = model_for("llama")
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        make_drafter(kind, model, refs),
        GreedyVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma="auto",
    )
    assert out.rows == refs and len(out.stats.chosen_gammas) == out.stats.target_calls
    policy = ComputeBoundTimings()
    out = generate(
        model,
        make_drafter(kind, model, refs),
        GreedyVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=policy,
    )
    assert out.rows == refs
    chosen = out.stats.chosen_gammas
    # the start value until a step is timed (then long drafts while the fit has seen one size of call), then,
    # once the fit sees the cost grow with the tokens scored, plain steps and one-token probes to the end
    assert chosen[:2] == [4, 4] and set(chosen[chosen.index(0) :]) == {0, 1}
    assert policy.costs.calls == out.stats.target_calls - len(policy.costs.seen_shapes)  # every other step timed


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_rows_stop_at_their_own_eos(arch):
    model = model_for(arch)
    free = [reference_greedy(model, torch.tensor([p]), NEW) for p in PROMPTS]
    # row 0 stops at a token it first emits after a few others; the other rows stop wherever (if ever) they emit it
    at = next(i for i in range(4, NEW) if free[0][i] not in free[0][:i])
    eos = free[0][at]
    refs = [reference_greedy(model, torch.tensor([p]), NEW, eos=eos) for p in PROMPTS]
    assert len(refs[0]) == at + 1 and any(len(r) == NEW for r in refs)
    ids, mask = left_padded(PROMPTS)
    for drafter in (NoDrafter(), ModelDrafter(perturbed_copy(model, 0.5, seed=1)), PromptLookupDrafter()):
        out = generate(
            model, drafter, GreedyVerifier(), ids, attention_mask=mask, max_new_tokens=NEW, gamma=4, eos_token_id=eos
        )
        assert out.rows == refs


def test_equal_length_rows_need_no_mask_and_one_row_with_a_mask_is_a_batch():
    model = model_for("llama")
    prompts = [[5, 17, 33], [9, 4, 7], [60, 61, 62]]
    refs = [reference_greedy(model, torch.tensor([p]), 12) for p in prompts]
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        GreedyVerifier(),
        torch.tensor(prompts),
        max_new_tokens=12,
        gamma=2,
    )
    assert out.rows == refs
    ids, mask = left_padded([[1, 2], [5, 17, 33]])
    out = generate(model, NoDrafter(), GreedyVerifier(), ids[1:], attention_mask=mask[1:], max_new_tokens=5)
    assert out.rows == [reference_greedy(model, torch.tensor([[5, 17, 33]]), 5)]


def test_a_row_the_caller_stops_leaves_and_the_others_go_on_unchanged():
    model = model_for("llama")
    refs = [reference_greedy(model, torch.tensor([p]), NEW) for p in PROMPTS]
    ids, mask = left_padded(PROMPTS)
    steps = []

    def on_tokens(emitted):
        steps.append(emitted)
        return [1] if len(steps) == 2 else None

    drafter = ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    out = generate(
        model, drafter, GreedyVerifier(), ids, attention_mask=mask, max_new_tokens=NEW, gamma=3, on_tokens=on_tokens
    )
    assert out.rows[0] == refs[0] and out.rows[2] == refs[2] and out.rows[3] == refs[3]
    assert out.rows[1] == refs[1][: len(out.rows[1])] and 2 <= len(out.rows[1]) < NEW
    assert all((step[1] == -1).all() for step in steps[2:])  # a row that left emits nothing more
    assert drafter.lm.row_length.shape[0] == 3 or drafter.lm.row_length.shape[0] < 3


@pytest.mark.parametrize("kind", ["none", "model", "ngram"])
def test_coupled_sampling_rows_equal_their_own_seeded_text(kind):
    """Seeded sampling is coupled per row: row b's text is its own batch-1 text for seed b."""
    model = model_for("llama")
    params = SamplingParams(temperature=0.9, top_p=0.95, coupling=True)
    seeds = [3, 4, 5, 6]
    expected = []
    for prompt, seed in zip(PROMPTS, seeds):
        one = generate(
            model,
            NoDrafter(),
            GumbelCouplingVerifier(),
            torch.tensor([prompt]),
            SamplingParams(temperature=0.9, top_p=0.95, seed=seed),
            max_new_tokens=16,
        )
        expected.append(one.new_tokens[0].tolist())
    greedy = [reference_greedy(model, torch.tensor([p]), 16) for p in PROMPTS]
    assert expected != greedy
    ids, mask = left_padded(PROMPTS)
    refs = [reference_greedy(model, torch.tensor([p]), 16) for p in PROMPTS]
    out = generate(
        model,
        make_drafter(kind, model, refs),
        ExactVerifier(params),
        ids,
        params,
        attention_mask=mask,
        max_new_tokens=16,
        gamma=3,
        seeds=seeds,
    )
    assert out.rows == expected


def test_speculative_sampling_at_temperature_zero_is_greedy_per_row():
    model = model_for("gpt2")
    refs = [reference_greedy(model, torch.tensor([p]), NEW) for p in PROMPTS]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        SpeculativeSamplingVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        gamma=4,
    )
    assert out.rows == refs


def test_uncoupled_sampling_in_a_batch_follows_the_target_distribution():
    """Many rows of one prompt, one step each: the first sampled token of each row (speculative sampling with a
    draft model, ragged acceptance) is distributed as the target's p."""
    torch.manual_seed(0)
    model = varied_model("llama")
    prompt = [5, 17, 33, 8]
    params = SamplingParams(temperature=1.0, coupling=False, seed=0)  # seeded: a reproducible draw
    with torch.no_grad():
        p = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1], params).double()
    rows = 1500
    ids = torch.tensor([prompt] * rows)
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        SpeculativeSamplingVerifier(),
        ids,
        params,
        max_new_tokens=2,
        gamma=3,
    )
    first = torch.tensor([r[0] for r in out.rows])
    counts = torch.bincount(first, minlength=p.shape[0]).double()
    assert chi2_statistic(counts, p) < chi2_critical(counts, p)


def test_bad_batches_are_clear_errors():
    model = model_for("llama")
    ids, mask = left_padded(PROMPTS)
    right_padded = torch.flip(mask, dims=[1])
    with pytest.raises(DraftVerifyError, match="pad on the left"):
        generate(model, NoDrafter(), GreedyVerifier(), ids, attention_mask=right_padded, max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="seeds has 2 entries for 4 rows"):
        generate(
            model,
            NoDrafter(),
            GumbelCouplingVerifier(),
            ids,
            SamplingParams(temperature=1.0, seed=1),
            attention_mask=mask,
            max_new_tokens=4,
            seeds=[1, 2],
        )


@pytest.mark.parametrize(
    "arch, kind", [("llama", "none"), ("llama", "model"), ("gpt2", "lookup_model"), ("gpt2", "prompt_lookup")]
)
def test_rows_joining_between_steps_equal_their_own_text(arch, kind):
    """Continuous batching: rows join a running batch (and others leave) between steps; each row's text is still
    its own batch-1 text."""
    model = model_for(arch)
    limits = [NEW, 6, NEW, 9]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    schedule = {2: [1, 2], 5: [3]}  # after step 2 rows 1 and 2 join, after step 5 row 3
    calls = []

    def admit():
        calls.append(len(calls) + 1)
        return [RowRequest(PROMPTS[i], limits[i]) for i in schedule.get(len(calls), [])]

    out = generate(
        model,
        make_drafter(kind, model, refs),
        GreedyVerifier(),
        torch.tensor([PROMPTS[0]]),
        max_new_tokens=limits[0],
        gamma=3,
        admit=admit,
    )
    assert out.rows == refs
    assert out.sequences[3, : len(PROMPTS[3]) + limits[3]].tolist() == PROMPTS[3] + refs[3]


@pytest.mark.parametrize("gamma", ["auto", "compute_bound"])
def test_gamma_auto_with_rows_joining_equals_their_own_text(gamma):
    """The server's case: gamma auto picks per step for the rows present while rows join and leave."""
    model = model_for("llama")
    limits = [NEW, 6, NEW, 9]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    join = lambda *rows: [RowRequest(PROMPTS[i], limits[i]) for i in rows]  # noqa: E731
    pending = [[], join(1, 2), [], [], join(3)]
    policy = ComputeBoundTimings() if gamma == "compute_bound" else gamma
    out = generate(
        model,
        make_drafter("model", model, refs),
        GreedyVerifier(),
        torch.tensor([PROMPTS[0]]),
        max_new_tokens=limits[0],
        gamma=policy,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == refs
    if gamma == "compute_bound":
        assert 0 in out.stats.chosen_gammas


def test_joining_rows_sample_with_their_own_seeds():
    model = model_for("llama")
    params = SamplingParams(temperature=0.9, coupling=True)
    seeds = [3, 4, 5, 6]
    expected = [
        generate(
            model,
            NoDrafter(),
            GumbelCouplingVerifier(),
            torch.tensor([p]),
            SamplingParams(temperature=0.9, seed=s),
            max_new_tokens=12,
        )
        .new_tokens[0]
        .tolist()
        for p, s in zip(PROMPTS, seeds)
    ]
    pending = [
        [RowRequest(PROMPTS[1], 12, seeds[1]), RowRequest(PROMPTS[2], 12, seeds[2])],
        [],
        [RowRequest(PROMPTS[3], 12, seeds[3])],
    ]
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        ExactVerifier(params),
        torch.tensor([PROMPTS[0]]),
        params,
        max_new_tokens=12,
        gamma=3,
        seeds=[seeds[0]],
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == expected


def test_one_token_prompts_start_and_join_a_batch():
    """Edge cases of the cache: rows with nothing prefilled (one-token prompts) start a batch and join one."""
    model = model_for("llama")
    prompts = [[12], [9], [5], [60, 61, 62]]
    refs = [reference_greedy(model, torch.tensor([p]), 10) for p in prompts]
    pending = [[RowRequest(prompts[2], 10)], [RowRequest(prompts[3], 10)]]
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        GreedyVerifier(),
        torch.tensor([prompts[0], prompts[1]]),
        max_new_tokens=10,
        gamma=2,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == refs
    first = [[RowRequest(prompts[3], 10)]]
    out = generate(
        model,
        NoDrafter(),
        GreedyVerifier(),
        torch.tensor([prompts[0]]),
        max_new_tokens=10,
        admit=lambda: first.pop(0) if first else [],
    )
    assert out.rows == [refs[0], refs[3]]


@pytest.mark.parametrize("gap_share", [0.0, 1.0])
def test_gaps_in_the_cache_and_full_repacks_give_the_same_text(gap_share):
    """Rows that accept fewer drafts leave gaps in the batch cache; they are hidden (max_gap_share 1: never
    re-packed) or packed away at once (0: every ragged step re-packs). Either way each row is its own text."""
    from draftverify.backends.hf.cached_lm import CachedLM

    model = model_for("gpt2")
    refs = [reference_greedy(model, torch.tensor([p]), NEW) for p in PROMPTS]
    target = CachedLM(model, role="target")
    draft = CachedLM(perturbed_copy(model, 0.5, seed=1), role="draft")
    target.max_gap_share = draft.max_gap_share = gap_share
    ids, mask = left_padded(PROMPTS)
    gaps = []  # per step: slots hidden after a row's first token (gaps, not left padding)

    def record(emitted):
        valid = target.valid
        gaps.append(int(((valid.long().cumsum(dim=1) > 0) & ~valid).sum()))

    out = generate(
        target,
        ModelDrafter(draft),
        GreedyVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        gamma=4,
        on_tokens=record,
    )
    assert out.rows == refs
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens
    assert (max(gaps) > 0) == (gap_share == 1.0)


MIXED = [
    SamplingParams(),
    SamplingParams(temperature=0.9, top_p=0.95, seed=3),
    SamplingParams(),
    SamplingParams(temperature=1.3, top_k=20, seed=5),
]


def own_text(model, prompt: list[int], params: SamplingParams, new: int) -> list[int]:
    """A row's batch-1 text under its own settings (the target alone)."""
    if params.greedy:
        return reference_greedy(model, torch.tensor([prompt]), new)
    return (
        generate(model, NoDrafter(), ExactVerifier(params), torch.tensor([prompt]), params, max_new_tokens=new)
        .new_tokens[0]
        .tolist()
    )


@pytest.mark.parametrize("kind", ["none", "model", "prompt_lookup", "ngram", "lookup_model"])
def test_rows_with_their_own_sampling_settings_equal_their_own_text(kind):
    """Per-row sampling: greedy rows and seeded rows of different temperature / top-k / top-p in one batch; each
    row is drafted and judged by its own settings, so it equals its own batch-1 text."""
    model = model_for("llama")
    expected = [own_text(model, p, s, 16) for p, s in zip(PROMPTS, MIXED)]
    refs = [reference_greedy(model, torch.tensor([p]), 16) for p in PROMPTS]
    assert expected[1] != refs[1] and expected[3] != refs[3]  # the sampled rows do sample
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        make_drafter(kind, model, refs),
        ExactVerifier(MIXED[0]),
        ids,
        MIXED,
        attention_mask=mask,
        max_new_tokens=16,
        gamma=3,
    )
    assert out.rows == expected


def test_joining_rows_keep_their_own_sampling_settings():
    model = model_for("llama")
    expected = [own_text(model, p, s, 12) for p, s in zip(PROMPTS, MIXED)]
    pending = [
        [RowRequest(PROMPTS[1], 12, MIXED[1].seed, params=MIXED[1])],
        [],
        [RowRequest(PROMPTS[2], 12, params=MIXED[2]), RowRequest(PROMPTS[3], 12, MIXED[3].seed, params=MIXED[3])],
    ]
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        ExactVerifier(MIXED[0]),
        torch.tensor([PROMPTS[0]]),
        MIXED[0],
        max_new_tokens=12,
        gamma=3,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == expected


def test_greedy_rows_beside_uncoupled_sampled_rows_stay_greedy_and_the_sampled_rows_follow_p():
    """Half the rows greedy, half sampled without coupling, one batch: every greedy row takes the target's argmax
    and the sampled rows' first tokens are distributed as the target's p (chi-square)."""
    torch.manual_seed(0)
    model = varied_model("llama")
    prompt = [5, 17, 33, 8]
    sampled = SamplingParams(temperature=1.0, coupling=False, seed=0)  # seeded: a reproducible draw
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    p = probs_from_logits(logits, sampled).double()
    rows = 1200
    params = [SamplingParams() if b % 2 == 0 else sampled for b in range(rows)]
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1)),
        ExactVerifier(params[0]),
        torch.tensor([prompt] * rows),
        params,
        max_new_tokens=2,
        gamma=3,
    )
    first = torch.tensor([r[0] for r in out.rows])
    assert bool((first[0::2] == int(logits.argmax())).all())
    counts = torch.bincount(first[1::2], minlength=p.shape[0]).double()
    assert chi2_statistic(counts, p) < chi2_critical(counts, p)
    wrong = torch.bincount(first[0::2], minlength=p.shape[0]).double()  # the greedy rows are not samples of p
    assert chi2_statistic(wrong, p) > chi2_critical(wrong, p)


def test_uncoupled_rows_with_their_own_settings_repeat_when_every_sampled_row_is_seeded():
    """Uncoupled sampling draws from the batch's one generator: seeded from the first sampled row's seed when every
    sampled row has one (the same text every run), fresh otherwise."""
    model = varied_model("llama")
    ids = torch.tensor([[5, 17, 33, 8]] * 16)
    seeded = [
        SamplingParams() if b % 4 == 0 else SamplingParams(temperature=1.0, coupling=False, seed=b) for b in range(16)
    ]
    drafter = lambda: ModelDrafter(perturbed_copy(model, 0.5, seed=1))  # noqa: E731
    runs = [
        generate(model, drafter(), ExactVerifier(seeded[1]), ids, seeded, max_new_tokens=4, gamma=3).rows
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len({tuple(r) for r in runs[0]}) > 2
    unseeded = [p if p.greedy else SamplingParams(temperature=1.0, coupling=False) for p in seeded]
    fresh = [
        generate(model, drafter(), ExactVerifier(seeded[1]), ids, unseeded, max_new_tokens=4, gamma=3).rows
        for _ in range(2)
    ]
    assert fresh[0] != fresh[1]


def test_per_row_settings_need_a_rule_that_judges_rows_apart():
    model = model_for("llama")
    ids, mask = left_padded(PROMPTS)
    with pytest.raises(DraftVerifyError, match="one sampling setting for the whole batch"):
        generate(model, NoDrafter(), SpeculativeSamplingVerifier(), ids, MIXED, attention_mask=mask, max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="params has 2 entries for 4 rows"):
        generate(model, NoDrafter(), ExactVerifier(MIXED[0]), ids, MIXED[:2], attention_mask=mask, max_new_tokens=4)


def tree_drafter(model, noise: float = 0.5):
    from draftverify.drafters import ModelTreeDrafter

    return ModelTreeDrafter(perturbed_copy(model, noise, seed=1))


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_tree_rows_equal_their_own_greedy_text(arch):
    """model_tree in a batch: one tree shape, each row its own tokens, per-row acceptance and branch commit in
    both the target's and the draft's caches; rows of different prompt lengths and limits."""
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        tree_drafter(model),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
    )
    assert out.rows == refs
    assert out.stats.accepted_tokens > 0  # the trees were accepted in part
    close = generate(
        model,
        tree_drafter(model, 0.1),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
    )  # a close draft: most of every tree is kept, rows diverge
    assert close.rows == refs and close.stats.target_calls < max(limits) * 2 // 3


def test_tree_rows_sample_with_their_own_seeds_and_settings():
    assert_mixed_rows_and_joining(tree_drafter)


def test_tree_rows_joining_between_steps_equal_their_own_text():
    model = model_for("llama")
    refs = [reference_greedy(model, torch.tensor([p]), 12) for p in PROMPTS]
    pending = [[RowRequest(PROMPTS[1], 12)], [], [RowRequest(PROMPTS[2], 12), RowRequest(PROMPTS[3], 12)]]
    out = generate(
        model,
        tree_drafter(model),
        ExactVerifier(SamplingParams()),
        torch.tensor([PROMPTS[0]]),
        max_new_tokens=12,
        gamma=3,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == refs


def assert_mixed_rows_and_joining(make_drafter) -> None:
    """Rows with their own sampling settings equal their own text, in one batch and when they join one."""
    model = model_for("llama")
    expected = [own_text(model, p, s, 12) for p, s in zip(PROMPTS, MIXED)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model, make_drafter(model), ExactVerifier(MIXED[0]), ids, MIXED, attention_mask=mask, max_new_tokens=12, gamma=3
    )
    assert out.rows == expected
    pending = [
        [RowRequest(PROMPTS[1], 12, MIXED[1].seed, params=MIXED[1])],
        [],
        [RowRequest(PROMPTS[2], 12, params=MIXED[2]), RowRequest(PROMPTS[3], 12, MIXED[3].seed, params=MIXED[3])],
    ]
    joined = generate(
        model,
        make_drafter(model),
        ExactVerifier(MIXED[0]),
        torch.tensor([PROMPTS[0]]),
        MIXED[0],
        max_new_tokens=12,
        gamma=3,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert joined.rows == expected


def bpd_drafter(model):
    """Heads as initialised (each head starts as head 1: it proposes the target's next token again), so rows
    accept different amounts: runs of a repeated token are accepted, the rest rejected."""
    from draftverify.drafters import BlockwiseDrafter, BlockwiseHeads

    torch.manual_seed(0)
    return BlockwiseDrafter(BlockwiseHeads.for_target(model, 4))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bpd_rows_equal_their_own_greedy_text(arch):
    """Blockwise heads in a batch: each row's heads read its own last kept hidden state of the verify pass."""
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        bpd_drafter(model),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=3,
    )
    assert out.rows == refs
    singles = [
        generate(
            model, bpd_drafter(model), ExactVerifier(SamplingParams()), torch.tensor([p]), max_new_tokens=n, gamma=3
        ).stats.accepted_tokens
        for p, n in zip(PROMPTS, limits)
    ]
    # each row drafts from its own state, as alone (a batched GEMM may round a head's near-tie differently)
    assert abs(out.stats.accepted_tokens - sum(singles)) <= 2 and out.stats.accepted_tokens > 0


def test_bpd_rows_sample_with_their_own_settings_and_join_between_steps():
    assert_mixed_rows_and_joining(lambda m: bpd_drafter(m))


def bpd_neural_drafter(model):
    """bpd_drafter's heads, each head's top 3 rescored left to right by a perturbed copy of the target."""
    from draftverify.drafters import BlockwiseNeuralDrafter

    heads = bpd_drafter(model).heads
    return BlockwiseNeuralDrafter(heads, CachedLM(perturbed_copy(model, 0.3, seed=5), role="draft"), k=3, alpha=1.0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bpd_neural_rows_equal_their_own_greedy_text_and_rescore_as_alone(arch):
    """bpd_neural in a batch: the rescorer decodes the rows as `model`'s draft does (each row fed the tokens it has
    not seen, its own accepted drafts kept), so each row drafts what it drafts alone."""
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        bpd_neural_drafter(model),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=3,
    )
    assert out.rows == refs
    singles = [
        generate(
            model,
            bpd_neural_drafter(model),
            ExactVerifier(SamplingParams()),
            torch.tensor([p]),
            max_new_tokens=n,
            gamma=3,
        ).stats
        for p, n in zip(PROMPTS, limits)
    ]
    assert abs(out.stats.accepted_tokens - sum(s.accepted_tokens for s in singles)) <= 2
    assert out.stats.accepted_tokens > 0 and out.stats.draft_calls > 0


def test_bpd_neural_rows_sample_with_their_own_settings_and_join_between_steps():
    assert_mixed_rows_and_joining(bpd_neural_drafter)


BITA = ["bita", "bita_tree", "bita_chain"]


def bita_drafter(model, method: str, prompt: str = "deep", seed: int = 1):
    """A random adapter (mask embeddings and a deep prompt): rows accept different, small amounts."""
    from draftverify.drafters import BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter
    from draftverify.drafters.bita_adapter import BitaAdapter

    torch.manual_seed(seed)
    adapter = BitaAdapter.for_target(model, 3, prompt, 4)
    cls, k = {"bita": (BitaEfficientDrafter, 2), "bita_tree": (BitaFullTreeDrafter, 2), "bita_chain": (BitaDrafter, 1)}[
        method
    ]
    return cls(adapter, k)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", BITA)
def test_bita_rows_equal_their_own_greedy_text(arch, method):
    """BiTA in a batch: the mask groups (learned embeddings + a deep prompt only they see) sit after each row's own
    pending token and tree nodes, and each row drafts from the group after its own last kept position."""
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        bita_drafter(model, method),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
    )
    assert out.rows == refs


def test_bita_rows_keep_whole_trees_of_a_self_predicting_target():
    """A target that always says token 0 and mask tokens that predict it: every row keeps whole trees, as alone."""
    import copy

    model = copy.deepcopy(model_for("llama"))
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, dtype=head.weight.dtype)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.copy_(-torch.arange(head.out_features, dtype=head.weight.dtype))
    ids, mask = left_padded(PROMPTS)
    for method in BITA:
        out = generate(
            model,
            bita_drafter(model, method),
            ExactVerifier(SamplingParams()),
            ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            gamma=4,
        )
        alone = generate(
            model,
            bita_drafter(model, method),
            ExactVerifier(SamplingParams()),
            torch.tensor([PROMPTS[0]]),
            max_new_tokens=NEW,
            gamma=4,
        )
        assert out.rows == [[0] * NEW] * len(PROMPTS)
        assert out.stats.target_calls == alone.stats.target_calls, method


@pytest.mark.parametrize("method", ["bita", "bita_chain"])
def test_bita_rows_sample_with_their_own_settings_and_join_between_steps(method):
    assert_mixed_rows_and_joining(lambda m: bita_drafter(m, method))


LOOKUP_PROMPTS = [[5, 17, 33, 8, 41, 5, 17, 33, 9, 5, 17], [9, 4, 9, 4, 7, 9, 4], [60, 61, 62, 60, 61], [12]]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_prompt_lookup_tree_rows_equal_their_own_greedy_text(arch):
    """Each row merges its own matches into its own trie; the batch scores them on one tree shape (the union of
    the rows' shapes) and a node a row lacks is never accepted there."""
    from draftverify.drafters import PromptLookupTreeDrafter

    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(LOOKUP_PROMPTS, limits)]
    ids, mask = left_padded(LOOKUP_PROMPTS)
    out = generate(
        model,
        PromptLookupTreeDrafter(max_ngram=2),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
    )
    assert out.rows == refs


def test_prompt_lookup_tree_rows_sample_with_their_own_settings():
    from draftverify.drafters import PromptLookupTreeDrafter

    model = model_for("llama")
    expected = [own_text(model, p, s, 14) for p, s in zip(LOOKUP_PROMPTS, MIXED)]
    ids, mask = left_padded(LOOKUP_PROMPTS)
    out = generate(
        model,
        PromptLookupTreeDrafter(max_ngram=2),
        ExactVerifier(MIXED[0]),
        ids,
        MIXED,
        attention_mask=mask,
        max_new_tokens=14,
        gamma=3,
    )
    assert out.rows == expected


def test_row_trees_put_each_rows_trie_on_one_shape_and_tree_sampling_follows_p():
    """Two prompts whose tries differ, many rows each, uncoupled tree sampling: each prompt's first sampled token
    is distributed as the target's p for that prompt (chi-square); a node a row lacks is never a candidate."""
    from draftverify.drafters.prompt_lookup_tree import trie
    from draftverify.tree import row_trees
    from draftverify.types import Draft
    from draftverify.verifiers import TreeSpeculativeSamplingVerifier

    tree, tokens, valid = row_trees([trie([[3, 4], [3, 5], [6]]), trie([[7]])])
    assert tree.size == 4 and valid.tolist() == [[True, True, True, True], [True, False, False, False]]
    assert tokens[1, 0] == 7 and tokens[0].tolist()[:2] == [3, 6]
    torch.manual_seed(0)
    vocab = 8
    p = torch.softmax(torch.randn(2, tree.size + 1, vocab), dim=-1)  # [prompt, N+1, V]
    rows = 20_000
    which = torch.arange(rows) % 2
    draft = Draft(tokens=tokens[which], tree=tree, valid=valid[which])
    params = SamplingParams(temperature=1.0, coupling=False)
    verdict = TreeSpeculativeSamplingVerifier().verify(draft, p[which].log(), params, torch.Generator().manual_seed(3))
    first = verdict.tokens[:, 0]
    for prompt in (0, 1):
        counts = torch.bincount(first[which == prompt], minlength=vocab).double()
        assert chi2_statistic(counts, p[prompt, 0].double()) < chi2_critical(counts, p[prompt, 0].double())
    assert not bool(((verdict.path >= 1) & (which[:, None] == 1)).any())  # row kind 1 has node 0 only


@pytest.mark.parametrize("p", [1, 3])
def test_lattice_bpd_rows_equal_their_own_greedy_text(p):
    """bpd_ngram (p = 1: each row's best rescored path, a chain) and bpd_pbest (p = 3: each row's trie of its p
    best paths on one tree shape): every row rescores its own lattice with its own context."""
    from draftverify.drafters import BlockwiseHeads, BlockwiseNgramDrafter

    model = model_for("llama")
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([q]), n) for q, n in zip(PROMPTS, limits)]
    table = NgramTable.from_sequences([q + r for q, r in zip(PROMPTS, refs)], order=3, vocab_size=VOCAB)
    torch.manual_seed(0)
    drafter = BlockwiseNgramDrafter(BlockwiseHeads.for_target(model, 4), table, k=3, alpha=0.5, p=p)
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model, drafter, ExactVerifier(SamplingParams()), ids, attention_mask=mask, max_new_tokens=limits, gamma=3
    )
    assert out.rows == refs and out.stats.accepted_tokens > 0


def nat_drafter(model, window: int = 6):
    """An untrained decoder-only NAT drafter (a window of the target's last hidden states): exact all the same."""
    from draftverify.drafters import NatDecoder, NatDrafter

    torch.manual_seed(0)
    return NatDrafter(
        NatDecoder.for_target(model, layers=1, block_size=4, ffn_size=64, memory_window=window).to(
            next(model.parameters()).dtype
        )
    )


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_nat_rows_equal_their_own_greedy_text(arch):
    """SpecDec's NAT drafter in a batch: each row keeps its own last W hidden states (right-aligned, padding
    masked), including a one-token prompt row that holds none at first."""
    model = model_for(arch)
    limits = [NEW, NEW - 7, NEW, 5]
    refs = [reference_greedy(model, torch.tensor([p]), n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    out = generate(
        model,
        nat_drafter(model),
        ExactVerifier(SamplingParams()),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
    )
    assert out.rows == refs and out.stats.draft_calls > 0


def test_nat_rows_draft_as_each_row_alone():
    """The first draft of each row in a batch equals that row's first draft alone (same memory, masked padding)."""
    model = model_for("llama")
    ids, mask = left_padded(PROMPTS[:3])
    seen: list = []

    class Spy(type(nat_drafter(model))):
        def propose(self, state, gamma):
            draft = super().propose(state, gamma)
            seen.append(draft.tokens.clone())
            return draft

    drafter = Spy(nat_drafter(model).nat)
    generate(model, drafter, ExactVerifier(SamplingParams()), ids, attention_mask=mask, max_new_tokens=5, gamma=4)
    batch_first = seen[0]
    assert batch_first.shape[1] == 4
    for b, prompt in enumerate(PROMPTS[:3]):
        seen.clear()
        generate(
            model,
            Spy(nat_drafter(model).nat),
            ExactVerifier(SamplingParams()),
            torch.tensor([prompt]),
            max_new_tokens=5,
            gamma=4,
        )
        assert torch.equal(batch_first[b], seen[0][0]), b


def test_nat_rows_sample_with_their_own_settings_and_join_between_steps():
    assert_mixed_rows_and_joining(lambda m: nat_drafter(m))
