"""Draft length by the drafter's own confidence (gamma `conf`, ConfidenceGamma): the model drafter ends a draft at
its first token whose max q is <= the threshold (that token included), each row of a batch on its own; through the
loop the output stays the target's for `model` and `lookup_model` (greedy on several architectures, batch rows =
batch-1 rows, coupled sampling = autoregressive coupled sampling)."""

from __future__ import annotations

import pytest
import torch

from conftest import left_padded, perturbed_copy, reference_greedy as _reference_greedy, varied_model
from draftverify import SamplingParams, generate
from draftverify.draft_length import ConfidenceGamma
from draftverify.drafters import LookupModelDrafter, ModelDrafter, NoDrafter
from draftverify.drafters.draft_positions import StagedForwards
from draftverify.types import DecodingState, Draft
from draftverify.verifiers import GreedyVerifier, GumbelCouplingVerifier
from draftverify.verifiers.exact import ExactVerifier

torch.set_num_threads(1)

PROMPT = [5, 17, 33, 8, 41, 5, 17]
PROMPTS = [[5, 17, 33, 8, 41, 5, 17], [9, 4], [60, 61, 62, 60, 61], [12]]
NEW = 32
ARCHS = ["llama", "gpt2"]

_models: dict = {}
_refs: dict = {}


def target(arch: str):
    if arch not in _models:
        _models[arch] = varied_model(arch)
    return _models[arch]


def draft_model(arch: str):
    key = (arch, "draft")
    if key not in _models:
        _models[key] = perturbed_copy(target(arch), 0.5, seed=1)
    return _models[key]


def reference_greedy(arch: str, prompt: list[int], new: int) -> list[int]:
    key = (arch, tuple(prompt), new)
    if key not in _refs:
        _refs[key] = _reference_greedy(target(arch), torch.tensor([prompt]), new)
    return _refs[key]


def state(prompt: list[int], confidence: float, params: SamplingParams | None = None) -> DecodingState:
    return DecodingState(
        tokens=torch.tensor([prompt]),
        source_ids=None,
        prompt_length=len(prompt),
        params=params or SamplingParams(),
        generator=None,
        draft_confidence=confidence,
    )


@torch.inference_mode()
def confidences(arch: str, prompt: list[int], gamma: int = 12) -> list[float]:
    """The draft's max q at each of its first gamma greedy positions after prompt (no stop: a fallback threshold no
    max q reaches down to makes the greedy draft compute q)."""
    drafter = ModelDrafter(draft_model(arch), fallback_threshold=1e-12)
    st = state(prompt, 0.0)
    drafter.start(st)
    return drafter.propose(st, gamma).q_probs[0].max(dim=-1).values.tolist()


def threshold(arch: str) -> float:
    """A threshold that ends these tiny random drafts often, but not always: the median draft confidence (their
    softmax is flat, max q about 0.02-0.1)."""
    values = sorted(confidences(arch, PROMPT) + confidences(arch, PROMPTS[1]))
    return values[len(values) // 2]


class Recording:
    """Wraps a drafter's propose to keep every draft it makes."""

    def __init__(self, drafter):
        self.drafts: list[Draft] = []
        original = drafter.propose

        def propose(st, gamma):
            draft = original(st, gamma)
            self.drafts.append(draft)
            return draft

        drafter.propose = propose


# ---------------------------------------------------------------- the drafter's stop


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_the_draft_ends_at_its_first_unconfident_token_that_token_included(arch):
    conf = confidences(arch, PROMPT)
    # the first position k >= 1 whose confidence is below every earlier one: a threshold equal to it (the test is
    # max q <= T, in float32 like q) ends the draft right there, at length k + 1; just below it the draft goes on
    k = next(i for i in range(1, len(conf)) if conf[i] < min(conf[:i]))
    for value, length in ((conf[k], k + 1), (min(conf[: k + 1]) - 1e-6, None)):
        drafter = ModelDrafter(draft_model(arch))
        st = state(PROMPT, value)
        drafter.start(st)
        draft = drafter.propose(st, 12)
        if length is None:
            assert draft.length > k + 1
        else:
            assert draft.length == length and drafter.forward_calls == length  # no forward past the stop
        full = ModelDrafter(draft_model(arch))
        full.start(state(PROMPT, 0.0))
        assert torch.equal(draft.tokens, full.propose(state(PROMPT, 0.0), 12).tokens[:, : draft.length])


@torch.inference_mode()
def test_the_cap_bounds_a_confident_draft_and_zero_never_stops():
    for value in (0.0, 1e-6):
        drafter = ModelDrafter(draft_model("llama"))
        st = state(PROMPT, value)
        drafter.start(st)
        assert drafter.propose(st, 7).length == 7
    drafter = ModelDrafter(draft_model("llama"))
    st = state(PROMPT, 1.0)  # every max q is <= 1: one token per draft
    drafter.start(st)
    assert drafter.propose(st, 7).length == 1


@torch.inference_mode()
def alone_drafts(arch: str, value: float, gamma: int = 8) -> list[list[int]]:
    """Each prompt's batch-1 draft with the stop at `value`."""
    out = []
    for prompt in PROMPTS:
        drafter = ModelDrafter(draft_model(arch))
        st = state(prompt, value)
        drafter.start(st)
        out.append(drafter.propose(st, gamma).tokens[0].tolist())
    return out


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_a_batch_drafts_until_its_last_row_stops_and_every_row_keeps_that_length(arch):
    # the lowest draft confidence (over the prompts) at which the rows' drafts end at different lengths
    candidates = sorted({c for p in PROMPTS for c in confidences(arch, p, 8)})
    value = next(v for v in candidates if len({len(a) for a in alone_drafts(arch, v)}) > 1)
    alone = alone_drafts(arch, value)
    ids, mask = left_padded(PROMPTS)
    drafter = ModelDrafter(draft_model(arch))
    st = DecodingState(
        tokens=ids,
        source_ids=None,
        prompt_length=ids.shape[1],
        params=SamplingParams(),
        generator=None,
        lengths=mask.sum(dim=1),
        draft_confidence=value,
    )
    drafter.start(st)
    draft = drafter.propose(st, 8)
    assert draft.length == max(len(a) for a in alone)  # the forward went on while any row drafted
    assert draft.lengths is None  # a row's own stop saves nothing: it drafts on with the batch
    for b, a in enumerate(alone):
        assert draft.tokens[b, : len(a)].tolist() == a


@torch.inference_mode()
def test_lookup_model_rows_drafted_by_the_model_share_the_batchs_stop():
    """A batch where one row copies (its 2-gram recurs) and the others take the draft model's tokens: those draft
    until the last of them stops (where its own batch-1 model draft ends)."""
    arch, rows = "llama", [[5, 17, 33, 8, 41, 5, 17], [9, 4], [12], [70, 71, 72]]
    candidates = sorted({c for p in rows[1:] for c in confidences(arch, p, 8)})

    def model_lengths(value: float) -> list[int]:
        out = []
        for prompt in rows[1:]:
            drafter = ModelDrafter(draft_model(arch))
            st = state(prompt, value)
            drafter.start(st)
            out.append(drafter.propose(st, 8).length)
        return out

    value = next(v for v in candidates if len(set(model_lengths(v))) > 1)
    ids, mask = left_padded(rows)
    drafter = LookupModelDrafter(draft_model(arch), max_ngram=3, min_ngram=2)
    st = DecodingState(
        tokens=ids,
        source_ids=None,
        prompt_length=ids.shape[1],
        params=SamplingParams(),
        generator=None,
        lengths=mask.sum(dim=1),
        draft_confidence=value,
    )
    drafter.start(st)
    draft = drafter.propose(st, 8)
    assert draft.tokens[0, :3].tolist() == [33, 8, 41]  # the copy
    assert draft.lengths[1:].tolist() == [max(model_lengths(value))] * 3


def lookup_says(continuation: list[int], prompt_length: int):
    """Stands in for StagedForwards._looked_up: prompt lookup 'finds' the given continuation (the tokens after those
    drafted so far, as many as the drafter has room for), so a test decides where lookup agrees with the draft."""

    def looked_up(forwards: StagedForwards, room: int) -> list[int]:
        drafted = len(forwards.text) - prompt_length  # text: the committed tokens, then the draft so far
        room = min(5, room - 1)  # as _looked_up: lookup_tokens, leaving the forward's own token
        return continuation[drafted : drafted + max(room, 0)]

    return looked_up


@torch.inference_mode()
def test_a_token_prompt_lookup_proposes_too_counts_as_confident(monkeypatch):
    """Staged drafting with the stop at 1.0 (every max q is <= 1): alone, each draft is one token; where lookup
    proposes the draft's own tokens the draft goes on through them, and it ends at the first token lookup does not
    propose (that token included): a looked-up token it does not choose, or the forward's own token after the 5
    looked-up ones. The tokens are the draft model's either way, and with lookup_confirms off the agreement is
    ignored."""
    full = ModelDrafter(draft_model("llama"))
    full.start(state(PROMPT, 0.0))
    own = full.propose(state(PROMPT, 0.0), 8).tokens[0].tolist()
    # lookup agrees on the draft's first 4 tokens, then proposes something else
    says = own[:4] + [(t + 1) % draft_model("llama").config.vocab_size for t in own[4:]]
    for confirms, continuation, length in ((True, own, 6), (True, says, 5), (False, own, 1)):
        drafter = ModelDrafter(draft_model("llama"), lookup_tokens=5, lookup_confirms=confirms)
        st = state(PROMPT, 1.0)
        drafter.start(st)
        assert drafter.stages
        monkeypatch.setattr(StagedForwards, "_looked_up", lookup_says(continuation, len(PROMPT)))
        draft = drafter.propose(st, 8)
        assert draft.length == length, (confirms, continuation)
        assert draft.tokens[0].tolist() == own[:length]


# ---------------------------------------------------------------- through the loop: lossless


def make(kind: str, arch: str):
    if kind == "model":
        return ModelDrafter(draft_model(arch))
    if kind == "staged":  # looked-up tokens ride along, and a token lookup proposes too counts as confident
        return ModelDrafter(draft_model(arch), lookup_tokens=5)
    return LookupModelDrafter(draft_model(arch), max_ngram=3, min_ngram=1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["model", "staged", "lookup_model"])
def test_greedy_output_is_the_targets_own(arch, kind):
    value = threshold(arch)
    expected = reference_greedy(arch, PROMPT, NEW)
    assert len(set(expected)) > 8  # varied text: the equality is not vacuous
    stopped = False
    for policy in (ConfidenceGamma(value, fixed=6), ConfidenceGamma(value), f"conf={value!r}", "conf"):
        drafter = make(kind, arch)
        out = generate(
            target(arch), drafter, GreedyVerifier(), torch.tensor([PROMPT]), max_new_tokens=NEW, gamma=policy
        )
        assert out.new_tokens[0].tolist() == expected, policy
        s = out.stats
        stopped |= any(0 < g < c for g, c in zip(s.gammas, s.chosen_gammas))
    assert stopped  # some drafts really ended early on low confidence


@pytest.mark.parametrize("kind", ["model", "lookup_model"])
def test_batch_rows_equal_their_batch_one_rows(kind):
    arch = "llama"
    value = threshold(arch)
    limits = [NEW, NEW - 9, NEW, 6]
    alone = [
        generate(
            target(arch),
            make(kind, arch),
            GreedyVerifier(),
            torch.tensor([p]),
            max_new_tokens=n,
            gamma=ConfidenceGamma(value, fixed=6),
        )
        .new_tokens[0]
        .tolist()
        for p, n in zip(PROMPTS, limits)
    ]
    assert alone == [reference_greedy(arch, p, n) for p, n in zip(PROMPTS, limits)]
    ids, mask = left_padded(PROMPTS)
    drafter = make(kind, arch)
    recording = Recording(drafter.model if kind == "lookup_model" else drafter)
    out = generate(
        target(arch),
        drafter,
        GreedyVerifier(),
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=ConfidenceGamma(value, fixed=6),
    )
    assert out.rows == alone
    assert any(d.length < 6 for d in recording.drafts)  # the batch's draft ended at its rows' stops, before the cap
    out = generate(
        target(arch), make(kind, arch), GreedyVerifier(), ids, attention_mask=mask, max_new_tokens=limits, gamma="conf"
    )
    assert out.rows == alone


@pytest.mark.parametrize("kind", ["model", "lookup_model"])
def test_coupled_sampling_text_is_the_autoregressive_text(kind):
    arch = "llama"
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    plain = (
        generate(
            target(arch), NoDrafter(), GumbelCouplingVerifier(), torch.tensor([PROMPT]), params, max_new_tokens=NEW
        )
        .new_tokens[0]
        .tolist()
    )
    assert plain != reference_greedy(arch, PROMPT, NEW)
    # under sampling the confidence is q's max as the draft samples from it (tempered, top-p filtered)
    value = sorted(confidences(arch, PROMPT))[6]
    for policy in (ConfidenceGamma(value, fixed=6), "conf"):
        out = generate(
            target(arch),
            make(kind, arch),
            ExactVerifier(params),
            torch.tensor([PROMPT]),
            params,
            max_new_tokens=NEW,
            gamma=policy,
        )
        assert out.new_tokens[0].tolist() == plain
    # a batch with one seed per row: each row is its own autoregressive coupled text
    seeds = [3, 4, 5, 6]
    expected = [
        generate(
            target(arch),
            NoDrafter(),
            GumbelCouplingVerifier(),
            torch.tensor([p]),
            SamplingParams(temperature=0.9, top_p=0.95, seed=s),
            max_new_tokens=16,
        )
        .new_tokens[0]
        .tolist()
        for p, s in zip(PROMPTS, seeds)
    ]
    ids, mask = left_padded(PROMPTS)
    batch_params = SamplingParams(temperature=0.9, top_p=0.95, coupling=True)
    out = generate(
        target(arch),
        make(kind, arch),
        ExactVerifier(batch_params),
        ids,
        batch_params,
        attention_mask=mask,
        max_new_tokens=16,
        gamma=ConfidenceGamma(value, fixed=6),
        seeds=seeds,
    )
    assert out.rows == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_model_tree_ends_at_its_first_unconfident_level_and_stays_the_targets_greedy(arch):
    from draftverify.drafters import ModelTreeDrafter

    value = threshold(arch)
    expected = reference_greedy(arch, PROMPT, NEW)
    drafter = ModelTreeDrafter(draft_model(arch))
    recording = Recording(drafter)
    out = generate(
        target(arch),
        drafter,
        ExactVerifier(SamplingParams()),
        torch.tensor([PROMPT]),
        max_new_tokens=NEW,
        gamma=ConfidenceGamma(value, fixed=4),
    )
    assert out.new_tokens[0].tolist() == expected
    depths = [d.depth for d in recording.drafts]
    assert min(depths) < 4 and max(depths) == 4  # some trees ended early, some grew to the cap
    for policy in ("conf", ConfidenceGamma(1.0, fixed=4)):  # 1.0: every tree ends at its first level
        out = generate(
            target(arch),
            ModelTreeDrafter(draft_model(arch)),
            ExactVerifier(SamplingParams()),
            torch.tensor([PROMPT]),
            max_new_tokens=NEW,
            gamma=policy,
        )
        assert out.new_tokens[0].tolist() == expected


def test_uncoupled_sampling_with_the_stop_follows_the_target_distribution():
    """Speculative sampling (no coupling), many rows of one prompt, the stop ending some rows' drafts after their
    first token and not others: each row's second token is distributed as the target's two-step marginal
    sum_x1 p(x1) p(x2 | x1)."""
    from conftest import chi2_critical, chi2_statistic
    from draftverify.sampling import probs_from_logits
    from draftverify.verifiers import SpeculativeSamplingVerifier

    torch.manual_seed(0)
    arch, prompt = "llama", [5, 17, 33, 8]
    params = SamplingParams(temperature=1.0, coupling=False, seed=0)  # seeded: a reproducible draw
    model = target(arch)
    with torch.no_grad():
        p1 = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1], params).double()  # [V]
        after = torch.tensor([prompt + [x] for x in range(p1.shape[0])])
        p2 = probs_from_logits(model(after).logits[:, -1], params).double()  # [V, V] p(x2 | x1)
    marginal = p1 @ p2
    with torch.no_grad():  # a threshold below the first draft token's confidence and at the median of the second's
        first_conf = probs_from_logits(draft_model(arch)(torch.tensor([prompt])).logits[0, -1], params).max()
        second_conf = probs_from_logits(draft_model(arch)(after).logits[:, -1], params).max(dim=-1).values
    value = float(second_conf.median())
    assert value < float(first_conf)
    rows = 1500
    drafter = ModelDrafter(draft_model(arch))
    recording = Recording(drafter)
    out = generate(
        model,
        drafter,
        SpeculativeSamplingVerifier(),
        torch.tensor([prompt] * rows),
        params,
        max_new_tokens=3,
        gamma=ConfidenceGamma(value, fixed=3),
    )
    first = recording.drafts[
        0
    ]  # about half the rows' own stops fire at the second token: they draft on, with the batch
    assert first.length == 3 and first.lengths is None
    second = torch.tensor([r[1] for r in out.rows])
    counts = torch.bincount(second, minlength=marginal.shape[0]).double()
    assert chi2_statistic(counts, marginal) < chi2_critical(counts, marginal)
