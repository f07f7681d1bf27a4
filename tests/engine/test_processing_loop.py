"""Logits processing through the loop: whatever the method, the text is the target's own decoding under the same
penalties, logit bias, min_tokens, ignore_eos and stop tokens (greedy: token for token, against a reference that
processes one position at a time from scratch; sampling: the same distribution, by chi-square past the first
position, where the draft tokens accepted before a position must count towards its penalties)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import build_model, chi2_critical, chi2_statistic, perturbed_copy, reference_greedy, varied_model
from draftverify import RowRequest, generate
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.engine.processors import Penalties, Processors
from draftverify.methods import MethodOptions, build_drafter, build_verifier, resolve_method
from draftverify.processing import Processing
from draftverify.sampling import probs_from_logits
from draftverify.types import SamplingParams
from processing_reference import processed_greedy, processed_row

EOS = 3
NEW = 30
PENALTIES_ = dict(repetition_penalty=1.3, frequency_penalty=0.3, presence_penalty=0.2)
METHODS = ("prompt_lookup", "model", "model_tree")  # chains from the text and from a draft model, a draft model's tree
_CASES: dict = {}


def case(arch: str):
    """A varied target, a draft that agrees with it often, a prompt that repeats itself and the target's plain
    continuation (so prompt lookup finds matches), and settings made for the target's plain text of that prompt: a
    bias that forbids its first token and favours its fourth, min_tokens and its second token made a stop token."""
    if arch not in _CASES:
        model = varied_model(arch)
        start = [1, 5, 7, 9, 11, 13]
        prompt = start + reference_greedy(model, torch.tensor([start]), 20) + start
        plain = reference_greedy(model, torch.tensor([prompt]), NEW, eos=EOS)
        settings = {
            "penalties": Processing(**PENALTIES_),
            "bias_min_stop": Processing(
                logit_bias={plain[0]: -100.0, plain[3]: 0.5}, min_tokens=8, stop_token_ids=[plain[1]]
            ),
            "ignore_eos": Processing(ignore_eos=True, **PENALTIES_),  # its text runs past an EOS
        }
        _CASES[arch] = (model, perturbed_copy(model, 0.1, 1), prompt, plain, settings)
    return _CASES[arch]


def decode(model, draft, method: str, prompts, processing, params=SamplingParams(), eos=EOS, **loop):
    m = resolve_method(method)
    options = MethodOptions(draft_model=draft)
    drafter = build_drafter(m.drafter, CachedLM(model), options)
    verifier = build_verifier(m.verifier, params, options)
    ids = torch.tensor(prompts) if len({len(p) for p in prompts}) == 1 else None
    if ids is None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        loop["attention_mask"] = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    return generate(model, drafter, verifier, ids, params, eos_token_id=eos, processing=processing, **loop)


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_every_method_gives_the_targets_processed_greedy_text(arch):
    model, draft, prompt, _, settings = case(arch)
    accepted = dict.fromkeys(METHODS, 0)
    for name, processing in settings.items():
        want = processed_greedy(model, prompt, NEW, processing, EOS)
        assert len(set(want)) > 5, (name, want)  # varied text: the comparison is not vacuous
        for method in METHODS:
            out = decode(model, draft, method, [prompt], processing, max_new_tokens=NEW, gamma=4)
            assert out.new_tokens[0].tolist() == want, (name, method)
            accepted[method] += out.stats.accepted_tokens
    assert all(accepted.values()), accepted  # every method's drafts were kept, under processing


def test_the_settings_change_the_text():
    model, _, prompt, plain, settings = case("llama")
    texts = {name: processed_greedy(model, prompt, NEW, p, EOS) for name, p in settings.items()}
    assert all(text != plain for text in texts.values()), texts
    assert EOS in texts["ignore_eos"][:-1] and len(texts["ignore_eos"]) == NEW  # on past its EOS
    assert EOS in texts["penalties"] and texts["penalties"][-1] == EOS  # the same settings end at the EOS
    stops = settings["bias_min_stop"].stops({EOS})
    assert not stops & set(texts["bias_min_stop"][:8])


@pytest.mark.parametrize("method", ["model", "prompt_lookup"])
def test_rows_with_their_own_processing_equal_their_own_text_and_may_join(method):
    model, draft, prompt, _, named = case("llama")
    prompts = [prompt, prompt[3:], prompt[:20]]
    settings = [named["penalties"], None, named["bias_min_stop"]]
    alone = [
        decode(model, draft, method, [p], s, max_new_tokens=NEW, gamma=4).new_tokens[0].tolist()
        for p, s in zip(prompts, settings)
    ]
    alone = [[t for t in row if t >= 0] for row in alone]
    together = decode(model, draft, method, prompts, settings, max_new_tokens=NEW, gamma=4)
    assert together.rows == alone
    joining = [RowRequest(prompt[5:], NEW, processing=named["ignore_eos"])]
    joined_alone = decode(model, draft, method, [prompt[5:]], named["ignore_eos"], max_new_tokens=NEW, gamma=4)

    def admit():
        return [joining.pop()] if joining else []

    out = decode(model, draft, method, prompts[:2], settings[:2], max_new_tokens=NEW, gamma=4, admit=admit)
    assert out.rows == alone[:2] + [joined_alone.new_tokens[0].tolist()]


def test_a_row_with_processing_joins_rows_that_have_none():
    """The loop skips the processors while no row has any (decided once, on the processors' own list): a row that
    joins with penalties then has them applied from its first token, and the rows without keep their plain text."""
    model, draft, prompt, _, named = case("llama")
    plain = decode(model, draft, "prompt_lookup", [prompt], None, max_new_tokens=NEW, gamma=4).rows[0]
    joined_alone = decode(model, draft, "prompt_lookup", [prompt[5:]], named["penalties"], max_new_tokens=NEW, gamma=4)
    assert joined_alone.rows[0] != decode(model, draft, "prompt_lookup", [prompt[5:]], None, max_new_tokens=NEW).rows[0]
    joining = [RowRequest(prompt[5:], NEW, processing=named["penalties"])]

    def admit():
        return [joining.pop()] if joining else []

    out = decode(model, draft, "prompt_lookup", [prompt], None, max_new_tokens=NEW, gamma=4, admit=admit)
    assert out.rows == [plain, joined_alone.rows[0]]


# ---- sampling: the processed distribution, past the first position ------------------------------------------------
VOCAB = 10
ROWS = 3000
PROMPT = [5, 7, 2, 9, 5, 7]
PARAMS = SamplingParams(temperature=1.0, seed=3, coupling=False)  # seeded speculative sampling
PENALTIES = Processing(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)


@pytest.fixture(scope="module")
def pair():
    """One-layer float32 models (a distribution test needs no float64), the draft peakier than the target."""
    target = build_model("llama", layers=1, seed=0, vocab=VOCAB).float()
    draft = build_model("llama", layers=1, seed=5, vocab=VOCAB, scale=2.0).float()
    return target, draft


@torch.no_grad()
def exact_joint(target, processing: Processing, eos: int | None) -> torch.Tensor:
    """p(x1, x2) [V, V] of the target under processing, one position at a time."""
    stops = processing.stops(set() if eos is None else {eos})
    first = target(torch.tensor([PROMPT])).logits[0, -1]
    p1 = probs_from_logits(processed_row(first, PROMPT, [], processing, stops), PARAMS)  # [V]
    contexts = torch.cat([torch.tensor([PROMPT]).expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)
    second = target(contexts).logits[:, -1]  # [V, V]
    p2 = torch.stack(
        [probs_from_logits(processed_row(second[x], PROMPT, [x], processing, stops), PARAMS) for x in range(VOCAB)]
    )
    return (p1[:, None] * p2).double()


def joint_counts(target, draft, processing: Processing, eos: int | None) -> torch.Tensor:
    """Counts [V, V] of (x1, x2) over ROWS rows of one batch, decoded by the `model` method, two drafts a step (no
    row ends before its second token: no EOS, or one that min_tokens forbids)."""
    out = decode(target, draft, "model", [PROMPT] * ROWS, processing, PARAMS, eos, max_new_tokens=2, gamma=2)
    tokens = out.new_tokens  # [ROWS, 2]
    assert tokens.shape == (ROWS, 2) and out.stats.accepted_tokens > 0 and out.stats.rejections > 0
    return torch.bincount(tokens[:, 0] * VOCAB + tokens[:, 1], minlength=VOCAB * VOCAB).double().view(VOCAB, VOCAB)


def passes(counts: torch.Tensor, p: torch.Tensor) -> bool:
    return chi2_statistic(counts.flatten(), p.flatten()) < chi2_critical(counts.flatten(), p.flatten())


def test_penalised_sampling_is_distributed_as_the_penalised_target(pair):
    target, draft = pair
    assert passes(joint_counts(target, draft, PENALTIES, None), exact_joint(target, PENALTIES, None))


def test_penalties_blind_to_the_accepted_drafts_fail_the_same_test(pair, monkeypatch):
    """The mistake a verify pass invites: penalising every position by the committed tokens alone."""
    target, draft = pair
    original = Penalties.__call__

    def blind(self, logits, state, step):
        step = step.at(step.positions.tolist())
        step.follows = torch.zeros_like(step.follows)  # as if no draft token came before any position
        return original(self, logits, state, step)

    monkeypatch.setattr(Penalties, "__call__", blind)
    p = exact_joint(target, PENALTIES, None)
    counts = joint_counts(target, draft, PENALTIES, None)
    assert not passes(counts, p)
    assert passes(counts.sum(dim=1), p.sum(dim=1))  # the first token is right: only the second shows it


def favoured(draft) -> int:
    """The token the draft proposes most often first: made a stop token that min_tokens forbids, so the cut acts."""
    with torch.no_grad():
        return int(draft(torch.tensor([PROMPT])).logits[0, -1].argmax())


def test_cutting_forbidden_drafts_keeps_sampling_exact(pair):
    """min_tokens forbids the draft's favourite token at both positions: the drafts holding it are cut before the
    target scores them, and the q of the rest is renormalised over what is allowed."""
    target, draft = pair
    stop = favoured(draft)
    processing = Processing(min_tokens=2)
    p = exact_joint(target, processing, stop)
    assert p[stop].sum() == 0 and p[:, stop].sum() == 0
    assert passes(joint_counts(target, draft, processing, stop), p)


def test_a_cut_that_keeps_the_drafters_own_q_fails_the_same_test(pair, monkeypatch):
    target, draft = pair
    stop = favoured(draft)
    original = Processors._without_forbidden

    def unnormalised(draft_, step, masks):
        cut = original(draft_, step, masks)
        return replace(cut, q_probs=draft_.q_probs[:, : cut.length])

    monkeypatch.setattr(Processors, "_without_forbidden", staticmethod(unnormalised))
    processing = Processing(min_tokens=2)
    assert not passes(joint_counts(target, draft, processing, stop), exact_joint(target, processing, stop))
