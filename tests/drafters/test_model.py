"""ModelDrafter: gamma tokens, BiLD fallback (alpha_FB), KV-cache bookkeeping on commit, q = the draft's (filtered)
softmax."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import build_model, forward_atol, reference_greedy
from draftverify.drafters import ModelDrafter
from draftverify.errors import DraftVerifyError
from draftverify.sampling import filter_logits
from draftverify.types import DecodingState, SamplingParams
from draftverify.verifiers.base import make_verdict

torch.set_num_threads(1)

PROMPT = [5, 17, 33, 8, 41]
SOURCE = [7, 22, 9, 14, 63]

_models: dict = {}

# a fallback threshold no max q reaches down to: a greedy draft then computes q (a stop rule reads it), which a
# test compares; without a stop rule a greedy draft is a deterministic proposal with no q (Draft.q_probs None)
SHOWS_Q = 1e-12


def model(arch: str = "llama"):
    if arch not in _models:
        if arch == "llama":  # greedy confidences after PROMPT vary and dip below earlier ones at positions 2..5
            _models[arch] = build_model("llama", layers=2, seed=3, scale=3.0)
        else:
            _models[arch] = build_model(arch, layers=1 if arch in ("t5", "bart") else 2, seed=2, scale=2.0)
    return _models[arch]


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


def start(drafter: ModelDrafter, arch: str, params: SamplingParams | None = None, generator=None) -> DecodingState:
    """Set up a decoding state as the loop does after the target's prefill and hand it to drafter.start."""
    params = params or SamplingParams()
    if model(arch).config.is_encoder_decoder:
        tokens = torch.tensor([[model(arch).config.decoder_start_token_id]])
        source = torch.tensor([SOURCE])
    else:
        tokens, source = torch.tensor([PROMPT]), None
    st = DecodingState(
        tokens=tokens, source_ids=source, prompt_length=tokens.shape[1], params=params, generator=generator
    )
    drafter.start(st)
    return st


def commit(drafter: ModelDrafter, st: DecodingState, draft_tokens: torch.Tensor, accepted: int, target_token: int):
    """What the loop does after verification: append accepted drafts + the target's token, then commit."""
    emitted = torch.cat([draft_tokens[:, :accepted], torch.tensor([[target_token]])], dim=1)
    verdict = make_verdict(draft_tokens, torch.tensor([accepted]), torch.tensor([target_token]))
    st.tokens = torch.cat([st.tokens, emitted], dim=1)
    st.lengths = st.lengths + emitted.shape[1]  # the loop keeps each row's length with its tokens
    drafter.commit(st, verdict)


def full_logits(arch: str, st: DecodingState, tokens: torch.Tensor) -> torch.Tensor:
    """The draft model's next-token logits at every decoder position, recomputed without a cache. -> [L, V]"""
    m = model(arch)
    if m.config.is_encoder_decoder:
        return m(input_ids=st.source_ids, decoder_input_ids=tokens).logits[0]
    return m(input_ids=tokens).logits[0]


def self_attention_keys(cache) -> list[torch.Tensor]:
    cache = getattr(cache, "self_attention_cache", cache)
    return [layer.keys for layer in cache.layers]


def fresh_keys(arch: str, st: DecodingState) -> list[torch.Tensor]:
    """Self-attention keys of a from-scratch cached forward over the committed tokens but the last."""
    reference = ModelDrafter(model(arch))
    reference.start(DecodingState(st.tokens, st.source_ids, st.tokens.shape[1], st.params, None))
    if model(arch).config.is_encoder_decoder and st.tokens.shape[1] > 1:
        reference.lm.forward(st.tokens[:, :-1])  # decoder-only start() already cached these
    assert reference.lm.length == st.tokens.shape[1] - 1
    return self_attention_keys(reference.lm.cache)


# ---------------------------------------------------------------- gamma without fallback


@pytest.mark.parametrize("arch", ["llama", "t5"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_proposes_exactly_gamma_greedy_tokens(arch, gamma):
    drafter = ModelDrafter(model(arch))
    st = start(drafter, arch)
    draft = drafter.propose(st, gamma)
    assert draft.tokens.shape == (1, gamma)
    assert draft.q_probs is None  # a greedy draft is a deterministic proposal: q one-hot, no softmax paid
    assert drafter.forward_calls == gamma
    if not model(arch).config.is_encoder_decoder:
        assert draft.tokens[0].tolist() == reference_greedy(model(arch), st.tokens, gamma)
    else:
        assert draft.tokens[0].tolist() == reference_greedy(model(arch), st.source_ids, gamma)


# ---------------------------------------------------------------- fallback (BiLD alpha_FB)


def confidences(arch: str, gamma: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and the max q of each drafted position, from a drafter that never falls back (a fallback
    threshold no max q reaches down to, SHOWS_Q)."""
    drafter = ModelDrafter(model(arch), fallback_threshold=SHOWS_Q)
    draft = drafter.propose(start(drafter, arch), gamma)
    return draft.tokens[0].tolist(), draft.q_probs[0].max(dim=-1).values.tolist()


def test_fallback_stops_before_first_unconfident_token():
    gamma = 8
    tokens, conf = confidences("llama", gamma)
    assert len(set(round(c, 6) for c in conf)) > 3, "confidences must vary for this test to mean anything"
    tested = 0
    for k in range(1, gamma):
        # a threshold between the k-th confidence and every earlier one: drafting stops before token k
        if conf[k] >= min(conf[:k]):
            continue
        alpha_fb = (conf[k] + min(conf[:k])) / 2
        drafter = ModelDrafter(model("llama"), fallback_threshold=alpha_fb)
        draft = drafter.propose(start(drafter, "llama"), gamma)
        assert draft.tokens[0].tolist() == tokens[:k]
        assert draft.q_probs.shape[1] == k
        assert drafter.forward_calls == k + 1  # the forward that revealed the low confidence is still paid
        tested += 1
    assert tested >= 2, f"no usable fallback position in {conf}"
    # a threshold below every confidence never falls back
    drafter = ModelDrafter(model("llama"), fallback_threshold=min(conf) / 2)
    assert drafter.propose(start(drafter, "llama"), gamma).tokens[0].tolist() == tokens


def test_fallback_checked_at_each_position_in_order():
    """Falls back at the FIRST position at or below alpha_FB, even if later ones would be confident again."""
    tokens, conf = confidences("llama", 8)
    threshold = sorted(conf)[3]  # four positions at or below it
    first = next(i for i, c in enumerate(conf) if c <= threshold)
    assert first > 0 and any(c > threshold for c in conf[first + 1 :]), conf
    drafter = ModelDrafter(model("llama"), fallback_threshold=threshold)
    draft = drafter.propose(start(drafter, "llama"), 8)
    assert draft.tokens[0].tolist() == tokens[:first]


def test_fallback_threshold_boundary_is_inclusive():
    """max q == alpha_FB falls back ("not above alpha_FB"); a hair lower does not."""
    tokens, conf = confidences("llama", 4)
    k = next(i for i in range(1, 4) if conf[i] < min(conf[:i]))
    exact = ModelDrafter(model("llama"), fallback_threshold=conf[k])
    assert exact.propose(start(exact, "llama"), 4).tokens[0].tolist() == tokens[:k]
    below = ModelDrafter(model("llama"), fallback_threshold=math.nextafter(conf[k], 0.0))
    out = below.propose(start(below, "llama"), 4).tokens[0].tolist()
    assert out[: k + 1] == tokens[: k + 1]


def test_fallback_one_always_falls_back_zero_never():
    always = ModelDrafter(model("llama"), fallback_threshold=1.0)
    draft = always.propose(start(always, "llama"), 5)
    assert draft.tokens.shape == (1, 0) and draft.length == 0
    never = ModelDrafter(model("llama"), fallback_threshold=0.0)
    assert never.propose(start(never, "llama"), 5).length == 5


def test_fallback_uses_filtered_q_under_sampling():
    """Under top-k the confidence is the filtered q's max, which is higher than the raw softmax's."""
    params = SamplingParams(temperature=1.0, top_k=2)
    drafter = ModelDrafter(model("llama"))
    st = start(drafter, "llama", params, torch.Generator().manual_seed(0))
    raw = full_logits("llama", st, st.tokens)[-1].float().softmax(-1).max().item()
    filtered = filter_logits(full_logits("llama", st, st.tokens)[-1].float(), params).softmax(-1).max().item()
    assert filtered > raw
    threshold = (raw + filtered) / 2
    drafter = ModelDrafter(model("llama"), fallback_threshold=threshold)
    assert drafter.propose(start(drafter, "llama", params, torch.Generator().manual_seed(0)), 1).length == 1
    greedy = ModelDrafter(model("llama"), fallback_threshold=threshold)
    assert greedy.propose(start(greedy, "llama"), 1).length == 0


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_rejects_bad_fallback_threshold(bad):
    with pytest.raises(DraftVerifyError, match="alpha_FB"):
        ModelDrafter(model("llama"), fallback_threshold=bad)


# ---------------------------------------------------------------- cache bookkeeping on commit


@pytest.mark.parametrize("arch", ["llama", "gpt2", "t5", "bart"])
def test_cache_after_commit_holds_committed_minus_one(arch):
    """Three steps with partial acceptance: after each commit the cache holds exactly the committed tokens but the
    last, and those are the accepted drafts (not the rejected ones): the keys equal a fresh prefill's."""
    drafter = ModelDrafter(model(arch))
    st = start(drafter, arch)
    assert drafter.lm.length == st.tokens.shape[1] - 1
    for accepted in (2, 0, 3):
        draft = drafter.propose(st, 4)
        wrong = (int(draft.tokens[0, accepted]) + 1) % model(arch).config.vocab_size  # the target disagrees here
        commit(drafter, st, draft.tokens, accepted, wrong)
        assert drafter.lm.length == st.tokens.shape[1] - 1
        got = self_attention_keys(drafter.lm.cache)
        want = fresh_keys(arch, st)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert torch.allclose(g, w, rtol=0, atol=forward_atol(model(arch), w)), (g - w).abs().max()


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_next_proposal_after_commit_equals_fresh_drafter(arch):
    drafter = ModelDrafter(model(arch), fallback_threshold=SHOWS_Q)
    st = start(drafter, arch)
    draft = drafter.propose(st, 5)
    commit(drafter, st, draft.tokens, 1, (int(draft.tokens[0, 1]) + 7) % model(arch).config.vocab_size)
    again = drafter.propose(st, 4)
    fresh = ModelDrafter(model(arch), fallback_threshold=SHOWS_Q)
    fresh.start(DecodingState(st.tokens, st.source_ids, st.tokens.shape[1], st.params, None))
    reference = fresh.propose(st, 4)
    assert torch.equal(again.tokens, reference.tokens)
    assert torch.allclose(again.q_probs, reference.q_probs, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_full_acceptance_keeps_all_fed_positions(arch):
    """All gamma drafts accepted: the last draft was never fed to the draft, so the cache holds committed - 2 and
    the next proposal feeds the two pending tokens (last draft + the target's bonus token)."""
    drafter = ModelDrafter(model(arch))
    st = start(drafter, arch)
    draft = drafter.propose(st, 3)
    commit(drafter, st, draft.tokens, 3, 11)
    assert drafter.lm.length == st.tokens.shape[1] - 2
    again = drafter.propose(st, 2)
    fresh = ModelDrafter(model(arch))
    fresh.start(DecodingState(st.tokens, st.source_ids, st.tokens.shape[1], st.params, None))
    assert torch.equal(again.tokens, fresh.propose(st, 2).tokens)


def test_commit_after_fallback_holds_committed_minus_one():
    tokens, conf = confidences("llama", 6)
    k = next(i for i in range(1, 6) if conf[i] < min(conf[:i]))
    drafter = ModelDrafter(model("llama"), fallback_threshold=conf[k])
    st = start(drafter, "llama")
    draft = drafter.propose(st, 6)
    assert draft.length == k
    commit(drafter, st, draft.tokens, k, 11)  # all k drafts kept, the target writes the fallback position
    assert drafter.lm.length == st.tokens.shape[1] - 1


# ---------------------------------------------------------------- q = the draft model's (filtered) softmax


def check_q(arch: str, params: SamplingParams, gamma: int = 5):
    generator = None if params.greedy else torch.Generator().manual_seed(4)
    drafter = ModelDrafter(model(arch), fallback_threshold=SHOWS_Q)
    st = start(drafter, arch, params, generator)
    draft = drafter.propose(st, gamma)
    seq = torch.cat([st.tokens, draft.tokens], dim=1)
    logits = full_logits(arch, st, seq)[st.tokens.shape[1] - 1 : -1]  # [gamma, V] at each drafted position
    if params.greedy:
        want = logits.float().softmax(-1)
        assert torch.equal(draft.tokens[0], logits.argmax(-1))
    else:
        want = filter_logits(logits.float(), params).softmax(-1)
        picked = want.gather(-1, draft.tokens[0][:, None])
        assert (picked > 0).all(), "drafted a token the filter removed"
    assert torch.allclose(draft.q_probs[0], want, atol=1e-6), (draft.q_probs[0] - want).abs().max()
    assert torch.allclose(draft.q_probs.sum(-1), torch.ones(1, gamma), atol=1e-5)
    return draft


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_q_is_softmax_when_greedy(arch):
    check_q(arch, SamplingParams())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.5),
    ],
    ids=["t0.7", "top_k5", "top_p0.5"],
)
def test_q_is_filtered_softmax_when_sampling(params):
    draft = check_q("llama", params)
    if params.top_k:
        assert ((draft.q_probs[0] > 0).sum(-1) == params.top_k).all()


def test_bind_checks_vocabulary_and_kind():
    from draftverify.backends.hf.cached_lm import CachedLM

    drafter = ModelDrafter(model("llama"))
    drafter.bind(CachedLM(model("gpt2")), 64)  # same vocabulary, both decoder-only
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        drafter.bind(CachedLM(model("t5")), 64)
    with pytest.raises(DraftVerifyError, match="positions"):
        drafter.bind(CachedLM(model("gpt2")), 10_000)


# ---------------------------------------------------------------- staged drafting (looked-up tokens ride along)


@pytest.mark.parametrize("lean", [False, True])
def test_staged_drafting_proposes_the_draft_models_own_tokens_with_fewer_forwards(lean):
    """On text that repeats, a forward that also scores the prompt-lookup continuation keeps the looked-up tokens
    equal to the draft's own greedy choices: the same draft (tokens and q) as one token per forward, in fewer
    forwards, and after each commit the cache holds what a drafter without lookup holds."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftverify.backends.lean_draft import draft_backend

    zoo = Path(__file__).resolve().parents[2] / "zoo" / "code"
    tokenizer = AutoTokenizer.from_pretrained(zoo / "tokenizer")
    weights = AutoModelForCausalLM.from_pretrained(zoo / "draft", dtype=torch.float32)
    text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef add(a, b):\n"
    prompt = torch.tensor([tokenizer(text).input_ids])
    drafters = [
        ModelDrafter(draft_backend(weights, "draft", False, lean), lookup_tokens=k, fallback_threshold=SHOWS_Q)
        for k in (0, 5)
    ]
    states = []
    for drafter in drafters:
        st = DecodingState(
            tokens=prompt.clone(),
            source_ids=None,
            prompt_length=prompt.shape[1],
            params=SamplingParams(),
            generator=None,
        )
        drafter.start(st)
        states.append(st)
    for accepted in (6, 2, 8):
        drafts = [d.propose(st, 8) for d, st in zip(drafters, states)]
        assert torch.equal(drafts[0].tokens, drafts[1].tokens)
        assert torch.allclose(drafts[0].q_probs, drafts[1].q_probs, atol=1e-4)
        wrong = (int(drafts[0].tokens[0, accepted]) + 1) if accepted < 8 else 11  # the target disagrees there
        for drafter, st, draft in zip(drafters, states, drafts):
            commit(drafter, st, draft.tokens, accepted, wrong)
        assert int(drafters[1].lm.row_length[0]) == int(drafters[0].lm.row_length[0])
    assert drafters[1].forward_calls < drafters[0].forward_calls  # looked-up tokens were kept, not drafted one by one


def test_staged_drafting_is_off_for_batches_and_without_lookup_tokens():
    drafter = ModelDrafter(model("llama"), lookup_tokens=5)
    st = DecodingState(
        tokens=torch.tensor([PROMPT, PROMPT]),
        source_ids=None,
        prompt_length=len(PROMPT),
        params=SamplingParams(),
        generator=None,
    )
    drafter.start(st)
    assert not drafter.stages
    start(drafter, "llama")
    assert drafter.stages
    plain = ModelDrafter(model("llama"))
    start(plain, "llama")
    assert not plain.stages


def test_staged_drafting_is_set_by_the_declared_options():
    """lookup_tokens and lookup_confirms are method options (load(), bench ab), read once by from_options; a
    compiled draft keeps fixed widths and stages nothing."""
    from draftverify.methods import MethodOptions

    draft = model("llama")
    made = ModelDrafter.from_options(draft, MethodOptions(draft_model=draft))
    assert (made.lookup_tokens, made.lookup_confirms) == (5, True)
    made = ModelDrafter.from_options(draft, MethodOptions(draft_model=draft, lookup_tokens=3, lookup_confirms=False))
    assert (made.lookup_tokens, made.lookup_confirms) == (3, False)
    compiled = MethodOptions(draft_model=draft, lookup_tokens=3, compile=True)
    assert ModelDrafter.from_options(draft, compiled).lookup_tokens == 0
    with pytest.raises(DraftVerifyError, match="lookup_tokens"):
        ModelDrafter.from_options(draft, MethodOptions(draft_model=draft, lookup_tokens=-1))
