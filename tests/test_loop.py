"""The decoding loop: exactness at the extremes of acceptance, with other verifiers and draft lengths (every registered
method on every architecture: tests/conformance), limits of BiLD, stop conditions, errors."""

from __future__ import annotations

import pytest
import torch

from conftest import ALL_ARCHS, CAUSAL_ARCHS, VOCAB, perturbed_copy, reference_greedy, varied_model
from draftverify import DraftVerifyError, RowRequest, SamplingParams, generate
from draftverify.backends.hf.shallow_view import shallow_view
from draftverify.draft_length import DraftLength, make_draft_length
from draftverify.drafters import (
    EarlyExitDrafter,
    LookupModelDrafter,
    ModelDrafter,
    NgramDrafter,
    NgramTable,
    NoDrafter,
    PromptLookupDrafter,
)
from draftverify.drafters.base import Drafter
from draftverify.drafters.extra_positions import ExtraPositionsTarget, VerifyExtras
from draftverify.methods import MethodOptions, build_verifier
from draftverify.sampling import gumbel_argmax, gumbel_noise, probs_from_logits
from draftverify.tree import TreeSpec
from draftverify.types import Draft
from draftverify.verifiers import (
    BildVerifier,
    GreedyVerifier,
    GumbelCouplingVerifier,
    SpeculativeSamplingVerifier,
    TopBetaVerifier,
)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17]])
NEW = 40


class RandomDrafter(Drafter):
    """Proposes uniform random tokens: almost nothing is accepted, every step exercises rollback."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, state, gamma):
        return Draft(tokens=torch.randint(0, VOCAB, (1, gamma), generator=self.gen))


_targets: dict = {}


def target_and_reference(arch: str):
    if arch not in _targets:
        model = varied_model(arch)
        ref = reference_greedy(model, PROMPT, NEW)
        assert len(set(ref)) >= 4, f"{arch}: reference text too repetitive to test anything"
        _targets[arch] = (model, ref)
    return _targets[arch]


def make_drafter(kind: str, model, arch: str):
    if kind == "self":
        return ModelDrafter(model)
    if kind == "perturbed":
        return ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    if kind == "random":
        return RandomDrafter()
    if kind == "prompt_lookup":
        return PromptLookupDrafter(max_ngram=3)
    if kind == "ngram":
        _, ref = target_and_reference(arch)
        corpus = [PROMPT[0].tolist() + ref[: NEW // 2], list(range(VOCAB))]  # half the answer: partial acceptance
        return NgramDrafter(NgramTable.from_sequences(corpus, order=3, vocab_size=VOCAB))
    if kind == "early_exit":
        return EarlyExitDrafter(model, num_layers=1)
    if kind == "none":
        return NoDrafter()
    if kind == "lookup_model":
        return LookupModelDrafter(perturbed_copy(model, 0.5, seed=1), max_ngram=3, min_ngram=2)
    raise ValueError(kind)


DRAFTERS = ["none", "self", "perturbed", "random", "prompt_lookup", "ngram", "early_exit", "lookup_model"]
# rules proven equal to greedy verification at temperature 0 (verdict-level tests in tests/verifiers): the full
# drafter x architecture grid runs with greedy; these run through the loop on the drafters that exercise
# partial acceptance and rollback, which is where a loop-level difference would show
GREEDY_EQUIVALENT_VERIFIERS = {
    "speculative_sampling": SpeculativeSamplingVerifier,
    "topbeta(1,0)": lambda: TopBetaVerifier(beta=1, tau=0.0),
    "gumbel_coupling": GumbelCouplingVerifier,
}


def check_lossless_greedy_run(arch: str, drafter_kind: str, verifier) -> None:
    model, ref = target_and_reference(arch)
    drafter = make_drafter(drafter_kind, model, arch)
    out = generate(model, drafter, verifier, PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    stats = out.stats
    assert stats.new_tokens == NEW
    # each call adds one target token, except that the last call's bonus may fall past max_new_tokens
    assert (
        stats.accepted_tokens + stats.target_calls - 1 <= stats.new_tokens <= stats.accepted_tokens + stats.target_calls
    )
    if drafter_kind == "self":
        assert stats.alpha == 1.0 and stats.rejections == 0
        assert stats.target_calls == -(-NEW // 5)  # gamma 4 drafts + 1 bonus per call
    if drafter_kind == "random":
        assert stats.alpha < 0.2
    if drafter_kind == "perturbed":
        assert 0 < stats.accepted_tokens < stats.drafted_tokens  # the interesting regime: partial acceptance


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("drafter_kind", ["self", "random", "perturbed"])
def test_the_acceptance_extremes_equal_target_greedy(arch, drafter_kind):
    """Every registered method's exactness on every architecture is tests/conformance; here the drafts at the
    extremes of acceptance over a longer text: the target itself (every draft kept), uniform random tokens (nearly
    every draft rolled back) and a perturbed copy (some kept, some not)."""
    check_lossless_greedy_run(arch, drafter_kind, GreedyVerifier())


@pytest.mark.parametrize("arch", ["llama", "gpt2", "t5"])
@pytest.mark.parametrize("drafter_kind", ["perturbed", "random", "prompt_lookup"])
@pytest.mark.parametrize("verifier_name", list(GREEDY_EQUIVALENT_VERIFIERS))
def test_greedy_equivalent_verifiers_equal_target_greedy(arch, drafter_kind, verifier_name):
    check_lossless_greedy_run(arch, drafter_kind, GREEDY_EQUIVALENT_VERIFIERS[verifier_name]())


@pytest.mark.parametrize("arch", ["llama", "t5"])
@pytest.mark.parametrize("gamma", [1, 3, "heuristic", "auto"])
def test_draft_length_policies_stay_exact(arch, gamma):
    model, ref = target_and_reference(arch)
    out = generate(
        model, make_drafter("perturbed", model, arch), GreedyVerifier(), PROMPT, max_new_tokens=NEW, gamma=gamma
    )
    assert out.new_tokens[0].tolist() == ref


class PlainStepsBetween(DraftLength):
    """gamma 0 (a plain step: no proposal), 0, 3, 0, 5, ...: how gamma auto interleaves plain decoding."""

    def __init__(self, pattern=(0, 0, 3, 0, 5)):
        self.pattern, self.step = pattern, 0

    def next(self, rows: int = 1) -> int:
        self.step += 1
        return self.pattern[(self.step - 1) % len(self.pattern)]


@pytest.mark.parametrize("arch", ["llama", "t5"])
@pytest.mark.parametrize("drafter_kind", DRAFTERS)
def test_plain_steps_between_drafts_stay_exact(arch, drafter_kind):
    """A step with gamma 0 skips the drafter's proposal; the drafter hears only the commit and catches up at its
    next proposal (a draft model feeds the tokens it skipped)."""
    if drafter_kind == "early_exit" and arch != "llama":
        pytest.skip("early exit is defined for decoder-only targets")
    model, ref = target_and_reference(arch)
    drafter = make_drafter(drafter_kind, model, arch)
    out = generate(model, drafter, GreedyVerifier(), PROMPT, max_new_tokens=NEW, gamma=PlainStepsBetween())
    assert out.new_tokens[0].tolist() == ref
    assert 0 in out.stats.chosen_gammas and out.stats.gammas[:2] == [0, 0]  # the plain steps drafted nothing
    if drafter_kind == "self":
        assert out.stats.rejections == 0 and out.stats.accepted_tokens > 0


@pytest.mark.parametrize("arch", ["gpt2", "bart"])
def test_eos_inside_an_accepted_draft_stops_there(arch):
    model, ref = target_and_reference(arch)
    eos = ref[9]  # a token the target emits at step 10: inside a draft of the perfect drafter
    expected = ref[: ref.index(eos) + 1]
    out = generate(
        model,
        make_drafter("self", model, arch),
        GreedyVerifier(),
        PROMPT,
        max_new_tokens=NEW,
        gamma=6,
        eos_token_id=eos,
    )
    assert out.new_tokens[0].tolist() == expected
    assert out.stats.new_tokens == len(expected)


@pytest.mark.parametrize("max_new", [1, 2, 7, 11])
def test_max_new_tokens_hit_mid_draft(max_new):
    model, ref = target_and_reference("qwen2")
    out = generate(
        model, make_drafter("self", model, "qwen2"), GreedyVerifier(), PROMPT, max_new_tokens=max_new, gamma=5
    )
    assert out.new_tokens[0].tolist() == ref[:max_new]
    assert out.stats.drafted_tokens <= max_new  # never drafts past the budget


def test_streamed_tokens_are_the_output():
    model, ref = target_and_reference("llama")
    seen: list[int] = []
    out = generate(
        model,
        make_drafter("perturbed", model, "llama"),
        GreedyVerifier(),
        PROMPT,
        max_new_tokens=NEW,
        on_tokens=lambda t: seen.extend(t[0].tolist()),
    )
    assert seen == out.new_tokens[0].tolist() == ref


# ---- BiLD limits -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "t5"])
def test_bild_never_falling_back_gives_the_small_models_greedy_text(arch):
    model, _ = target_and_reference(arch)
    small = perturbed_copy(model, 0.5, seed=1)
    small_text = reference_greedy(small, PROMPT, NEW)
    # alpha_FB = 0 never falls back; no cap on consecutive small tokens; alpha_RB huge never rolls back
    out = generate(
        model,
        ModelDrafter(small, fallback_threshold=0.0),
        BildVerifier(rollback_threshold=1e9),
        PROMPT,
        max_new_tokens=NEW,
        gamma=NEW,
    )
    assert out.new_tokens[0].tolist() == small_text
    assert small_text != reference_greedy(model, PROMPT, NEW)  # the limit is distinguishable from the target's text


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "t5"])
def test_bild_always_falling_back_gives_the_targets_text(arch):
    model, ref = target_and_reference(arch)
    out = generate(
        model,
        ModelDrafter(perturbed_copy(model, 0.5, seed=1), fallback_threshold=1.0),
        BildVerifier(rollback_threshold=1e9),
        PROMPT,
        max_new_tokens=NEW,
        gamma=10,
    )
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.drafted_tokens == 0


def test_bild_zero_rollback_threshold_only_keeps_tokens_the_target_is_sure_of():
    model, ref = target_and_reference("llama")
    out = generate(
        model, ModelDrafter(model), BildVerifier(rollback_threshold=0.0), PROMPT, max_new_tokens=NEW, gamma=4
    )
    # -log p(x) > 0 for every token with p(x) < 1, so every draft is rolled back and the target decodes alone
    assert out.new_tokens[0].tolist() == ref
    assert out.stats.accepted_tokens == 0


def test_bild_early_exit_variant_runs_and_uses_the_shallow_model():
    model, ref = target_and_reference("gpt_neox")
    shallow_text = reference_greedy(shallow_view(model, 1), PROMPT, NEW)
    assert shallow_text != ref  # the two models are distinguishable by their text
    # never falling back and never rolling back, BiLD writes exactly the 1-layer view's greedy text
    out = generate(
        model,
        EarlyExitDrafter(model, num_layers=1, fallback_threshold=0.0),
        BildVerifier(1e9),
        PROMPT,
        max_new_tokens=NEW,
        gamma=NEW,
    )
    assert out.new_tokens[0].tolist() == shallow_text
    assert out.stats.draft_calls == out.stats.drafted_tokens == NEW
    # with a finite rollback threshold the target keeps part of the shallow model's tokens and replaces the rest
    # (a 1-layer view of a random 2-layer model is nearly uniform, so alpha_RB = 3 is where both happen)
    model, ref = target_and_reference("llama")
    out = generate(
        model, EarlyExitDrafter(model, num_layers=1), BildVerifier(3.0), PROMPT, max_new_tokens=NEW, gamma=10
    )
    assert out.stats.new_tokens == NEW and out.stats.accepted_tokens > 0 and out.stats.rejections > 0
    assert out.new_tokens[0].tolist() not in (ref, reference_greedy(shallow_view(model, 1), PROMPT, NEW))


# ---- sampling through the loop ------------------------------------------------------------------------------


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    model, _ = target_and_reference("llama")
    params = SamplingParams(temperature=1.0, seed=7)
    runs = [
        generate(
            model,
            make_drafter("perturbed", model, "llama"),
            SpeculativeSamplingVerifier(),
            PROMPT,
            params,
            max_new_tokens=20,
        ).new_tokens
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
    other = generate(
        model,
        make_drafter("perturbed", model, "llama"),
        SpeculativeSamplingVerifier(),
        PROMPT,
        SamplingParams(temperature=1.0, seed=8),
        max_new_tokens=20,
    ).new_tokens
    assert not torch.equal(runs[0], other)


@pytest.mark.parametrize("coupling", [False, True])
def test_sampled_first_token_follows_target_distribution_through_the_loop(coupling):
    """End to end: the first token's frequencies are as close to p as exact samples from p would be, and
    clearly farther from the draft's q (so a rule that passed q's samples through would fail)."""
    model, _ = target_and_reference("gpt2")
    draft_model = perturbed_copy(model, 3.0, seed=3)
    with torch.no_grad():
        p = model(input_ids=PROMPT).logits[0, -1].softmax(-1)
        q = draft_model(input_ids=PROMPT).logits[0, -1].softmax(-1)
    draws = 800
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    drafter = ModelDrafter(draft_model)
    verifier = GumbelCouplingVerifier() if coupling else SpeculativeSamplingVerifier()
    for seed in range(draws):
        out = generate(
            model,
            drafter,
            verifier,
            PROMPT,
            SamplingParams(1.0, seed=seed, coupling=coupling),
            max_new_tokens=2,
            gamma=1,
        )
        counts[out.new_tokens[0, 0]] += 1
    tv = lambda freq, dist: 0.5 * (freq - dist).abs().sum()  # noqa: E731
    gen = torch.Generator().manual_seed(0)
    null = torch.stack(
        [
            tv(torch.bincount(torch.multinomial(p, draws, True, generator=gen), minlength=VOCAB) / draws, p)
            for _ in range(300)
        ]
    )
    threshold = float(null.max())
    assert float(tv(counts / draws, p)) <= threshold
    assert float(tv(q, p)) > 2 * threshold


# ---- coupled (position-keyed) sampling: the seeded text is the target's alone --------------------------------


@torch.no_grad()
def reference_coupled(model, params: SamplingParams, seed: int, max_new_tokens: int = NEW) -> list[int]:
    """The target's own Gumbel-max sampling, recomputed from scratch each step: at decoder position t the token
    is argmax(log p_t + G_t) with G_t = gumbel_noise(seed, t)."""
    if model.config.is_encoder_decoder:
        seq = torch.tensor([[model.config.decoder_start_token_id]])
        step = lambda s: model(input_ids=PROMPT, decoder_input_ids=s).logits[0, -1]  # noqa: E731
    else:
        seq = PROMPT
        step = lambda s: model(input_ids=s).logits[0, -1]  # noqa: E731
    for _ in range(max_new_tokens):
        p = probs_from_logits(step(seq), params)
        token = int(gumbel_argmax(p, gumbel_noise(seed, seq.shape[1], 1, VOCAB)[0]))
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
    return seq[0, -max_new_tokens:].tolist()


COUPLED = SamplingParams(temperature=1.5, top_p=0.95, seed=5)  # coupled by default: seeded


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_seeded_coupled_text_is_the_targets_own_gumbel_max_draw(arch):
    """The loop alone and at the extremes of acceptance give the draw recomputed from scratch; every registered
    method gives the loop's own (`autoregressive`) seeded text in tests/conformance."""
    model, _ = target_and_reference(arch)
    expected = reference_coupled(model, COUPLED, seed=5)
    assert len(set(expected)) >= 4
    for kind in ("none", "self", "random", "perturbed"):
        out = generate(
            model,
            make_drafter(kind, model, arch),
            GumbelCouplingVerifier(),
            PROMPT,
            COUPLED,
            max_new_tokens=NEW,
            gamma=4,
        )
        assert out.new_tokens[0].tolist() == expected, kind
        if kind == "self":
            assert out.stats.alpha == 1.0  # the same noise over the same distribution: every draft is kept


@pytest.mark.parametrize("gamma", [1, 2, 5, "heuristic", "auto"])
def test_seeded_coupled_text_does_not_depend_on_the_draft_length(gamma):
    model, _ = target_and_reference("gpt_neox")
    out = generate(
        model,
        make_drafter("perturbed", model, "gpt_neox"),
        GumbelCouplingVerifier(),
        PROMPT,
        COUPLED,
        max_new_tokens=NEW,
        gamma=gamma,
    )
    assert out.new_tokens[0].tolist() == reference_coupled(model, COUPLED, seed=5)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens


def test_coupled_text_changes_with_the_seed_and_unseeded_coupling_still_samples():
    model, _ = target_and_reference("qwen2")
    texts = {
        tuple(
            generate(
                model,
                make_drafter("perturbed", model, "qwen2"),
                GumbelCouplingVerifier(),
                PROMPT,
                SamplingParams(temperature=1.0, seed=seed),
                max_new_tokens=12,
            )
            .new_tokens[0]
            .tolist()
        )
        for seed in range(4)
    }
    assert len(texts) == 4
    unseeded = SamplingParams(temperature=1.0, coupling=True)
    runs = {
        tuple(
            generate(model, NoDrafter(), GumbelCouplingVerifier(), PROMPT, unseeded, max_new_tokens=12)
            .new_tokens[0]
            .tolist()
        )
        for _ in range(3)
    }
    assert len(runs) == 3


# ---- bad input -----------------------------------------------------------------------------------------------


def test_different_vocabularies_are_rejected():
    from conftest import build_model

    model, _ = target_and_reference("llama")
    other = build_model("llama")
    other.resize_token_embeddings(VOCAB + 8)
    with pytest.raises(DraftVerifyError, match="different vocabularies"):
        generate(model, ModelDrafter(other), GreedyVerifier(), PROMPT, max_new_tokens=4)


def test_decoder_only_draft_for_encoder_decoder_target_is_rejected():
    t5, _ = target_and_reference("t5")
    llama, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        generate(t5, ModelDrafter(llama), GreedyVerifier(), PROMPT, max_new_tokens=4)


def test_empty_prompt_is_rejected():
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match="prompt is empty"):
        generate(model, NoDrafter(), GreedyVerifier(), torch.zeros((1, 0), dtype=torch.long), max_new_tokens=4)


def test_a_drafter_that_never_drafts_is_never_asked_and_every_step_is_plain():
    """Drafter.drafts False (autoregressive): the loop runs a fixed length 0 whatever gamma says, so its propose is
    never called, and the text is the target's greedy decoding."""
    model, reference = target_and_reference("llama")

    class Silent(NoDrafter):
        def propose(self, state, gamma):
            raise AssertionError("a drafter that never drafts was asked for a draft")

    out = generate(model, Silent(), GreedyVerifier(), PROMPT, max_new_tokens=12, gamma=4)
    assert out.new_tokens[0].tolist() == reference_greedy(model, PROMPT, 12)
    assert out.stats.chosen_gammas == [0] * 12 and out.stats.drafted_tokens == 0


@pytest.mark.parametrize("gamma", [0, -1, 2.5, "fast"])
def test_bad_gamma_is_rejected(gamma):
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match="gamma"):
        generate(model, NoDrafter(), GreedyVerifier(), PROMPT, max_new_tokens=4, gamma=gamma)


def test_batches_with_a_one_row_drafter_or_verifier_are_clear_errors():
    model, _ = target_and_reference("llama")

    class OneRowDrafter(NoDrafter):
        name = "one_row"
        supports_batch = False

    with pytest.raises(DraftVerifyError, match="'one_row' drafter runs one row at a time"):
        generate(model, OneRowDrafter(), GreedyVerifier(), PROMPT.repeat(2, 1), max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="bild verifier checks one row at a time"):
        generate(model, NoDrafter(), BildVerifier(), PROMPT.repeat(2, 1), max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="max_new_tokens has 3 entries for 2 rows"):
        generate(model, NoDrafter(), GreedyVerifier(), PROMPT.repeat(2, 1), max_new_tokens=[4, 4, 4])
    t5, _ = target_and_reference("t5")
    with pytest.raises(DraftVerifyError, match="decoder-only target that takes position_ids"):
        generate(t5, NoDrafter(), GreedyVerifier(), PROMPT.repeat(2, 1), max_new_tokens=4)


def test_prompt_longer_than_context_is_rejected():
    model, _ = target_and_reference("gpt2")  # n_positions = 256
    long_prompt = torch.randint(0, VOCAB, (1, 250))
    with pytest.raises(DraftVerifyError, match="at most 256 positions"):
        generate(model, NoDrafter(), GreedyVerifier(), long_prompt, max_new_tokens=10)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda m: ModelDrafter(m, fallback_threshold=1.5), "alpha_FB"),
        (lambda m: ModelDrafter(m, fallback_threshold=-0.1), "alpha_FB"),
        (lambda m: BildVerifier(rollback_threshold=-1.0), "alpha_RB"),
        (lambda m: SpeculativeSamplingVerifier(lenience=0.0), "lenience"),
        (lambda m: TopBetaVerifier(beta=0), "beta"),
        (lambda m: TopBetaVerifier(tau=-0.5), "tau"),
        (lambda m: EarlyExitDrafter(m, num_layers=2), "layer count"),
        (lambda m: SamplingParams(temperature=-1.0), "temperature"),
        (lambda m: SamplingParams(temperature=1.0, top_p=0.0), "top_p"),
        (lambda m: SamplingParams(temperature=1.0, top_k=-3), "top_k"),
    ],
)
def test_out_of_range_settings_name_the_problem(build, match):
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match=match):
        build(model)


def test_greedy_verifier_refuses_sampling():
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match="temperature 0"):
        generate(model, NoDrafter(), GreedyVerifier(), PROMPT, SamplingParams(temperature=1.0), max_new_tokens=4)


# ---------------------------------------------------------------- token trees

TREE_PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (1, 0, 0), (1, 0, 0, 0)]


class RandomTreeDrafter(Drafter):
    """Uniform random tokens on a fixed tree: nearly every step rejects at the root's children."""

    def __init__(self, paths=TREE_PATHS, seed: int = 0):
        super().__init__()
        self.tree = TreeSpec.from_paths(paths)
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, state, gamma):
        return Draft(tokens=torch.randint(0, VOCAB, (1, self.tree.size), generator=self.gen), tree=self.tree)


class HiddenAnswerTreeDrafter(Drafter):
    """Puts the target's true continuation on the branch (1,), (1, 0), (1, 0, 0), ... and wrong tokens elsewhere,
    so the accepted branch is never the first one: the cache must gather, not crop."""

    def __init__(self, reference: list[int], paths=TREE_PATHS):
        super().__init__()
        self.reference = reference
        self.tree = TreeSpec.from_paths(paths)
        ordered = sorted(paths, key=lambda p: (len(p), p))
        self.true_nodes = {ordered.index(p): len(p) - 1 for p in ordered if p[0] == 1 and all(r == 0 for r in p[1:])}

    def propose(self, state, gamma):
        done = state.tokens.shape[1] - state.prompt_length
        answer = self.reference[done:] + [0] * self.tree.max_depth
        tokens = [
            answer[self.true_nodes[j]] if j in self.true_nodes else (answer[d - 1] + 1 + j) % VOCAB
            for j, d in enumerate(self.tree.depth.tolist())
        ]
        return Draft(tokens=torch.tensor([tokens]), tree=self.tree)


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
@pytest.mark.parametrize("kind", ["random", "hidden_answer"])
def test_tree_drafts_equal_target_greedy(arch, kind):
    model, ref = target_and_reference(arch)
    drafter = RandomTreeDrafter() if kind == "random" else HiddenAnswerTreeDrafter(ref)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(model, drafter, verifier, PROMPT, max_new_tokens=NEW, gamma=4)
    assert out.new_tokens[0].tolist() == ref
    stats = out.stats
    assert stats.new_tokens == NEW and stats.drafted_tokens == stats.target_calls * len(TREE_PATHS)
    if kind == "hidden_answer":  # the answer branch is 4 deep (1, 0, 0, 0): 5 tokens per call but the last
        assert stats.target_calls == -(-NEW // 5) and stats.rejections == 0
    else:
        assert stats.accepted_tokens < stats.target_calls


def test_tree_draft_with_a_chain_verifier_is_refused():
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match="checks chains only"):
        generate(model, RandomTreeDrafter(), GreedyVerifier(), PROMPT, max_new_tokens=4)


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_tree_draft_for_a_model_without_position_ids_is_refused(arch):
    model, _ = target_and_reference(arch)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    with pytest.raises(DraftVerifyError, match="cannot score a token tree"):
        generate(model, RandomTreeDrafter(), verifier, PROMPT, max_new_tokens=4)


# ---------------------------------------------------------------- the channel from the verify pass to drafters


class HiddenReadingDrafter(Drafter):
    """Reads the target's outputs in commit and appends two BiTA-style extra positions to every verify pass."""

    needs_target_hidden = True
    drafts_in_target_pass = True

    def __init__(self, tree: TreeSpec | None = None):
        super().__init__()
        self.tree = tree
        self.gen = torch.Generator().manual_seed(3)
        self.seen = []

    def propose(self, state, gamma):
        size = self.tree.size if self.tree is not None else gamma
        return Draft(tokens=torch.randint(0, VOCAB, (1, size), generator=self.gen), tree=self.tree)

    def extras(self, tree, length, batch):
        width = 1 + length + 2
        mask = torch.ones(2, width, dtype=torch.bool).tril(diagonal=1 + length)  # each sees everything before it
        embeds = self.embedding(torch.tensor([[VOCAB - 1, VOCAB - 1]]))  # [1, 2, H]
        depth = self.tree.max_depth if tree else length
        return VerifyExtras(embeds=embeds, positions=depth + 1 + torch.arange(2), mask=mask)

    def wrap_target(self, target):
        self.embedding = target.model.get_input_embeddings()
        return ExtraPositionsTarget(target, self.extras, "extra positions")

    def commit(self, state, verdict, scored=None):
        self.seen.append((int(verdict.num_accepted[0]), int(state.tokens[0, -1]), scored))


@pytest.mark.parametrize("tree", [None, TreeSpec.from_paths(TREE_PATHS)], ids=["chain", "tree"])
def test_drafters_receive_the_kept_positions_and_extra_positions_are_never_committed(tree):
    model, ref = target_and_reference("llama")
    drafter = HiddenReadingDrafter(tree)
    policy = make_draft_length("auto")
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(model, drafter, verifier, PROMPT, max_new_tokens=NEW, gamma=policy)
    assert out.new_tokens[0].tolist() == ref  # the extra positions changed nothing that was committed
    assert policy.folded and policy.c() == 0.0  # drafting inside the verify pass costs nothing of its own
    hidden_size = model.config.hidden_size
    for n, last_token, scored in drafter.seen[:-1]:  # the last step may be cut at max_new_tokens
        assert scored.logits.shape[:2] == scored.hidden.shape[:2] == (1, 1 + n + 2)
        assert scored.hidden.shape[-1] == hidden_size
        assert int(scored.logits[0, n].argmax()) == last_token  # the target's token after the kept branch


def test_sampling_without_a_seed_leaves_the_global_rng_alone():
    model, _ = target_and_reference("gpt2")
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    generate(
        model,
        make_drafter("perturbed", model, "gpt2"),
        SpeculativeSamplingVerifier(),
        PROMPT,
        SamplingParams(temperature=1.0),
        max_new_tokens=8,
    )
    assert torch.equal(torch.random.get_rng_state(), before)


# ---------------------------------------------------------------- a constrained first token (token healing)
# loop.generate(first_token_allowed=...) masks the target's logits for each row's first new token; the output
# must equal the target's own decoding of the same prompt under the same constraint, recomputed here from
# scratch (one forward, mask, argmax, then plain greedy), for every method.


@torch.no_grad()
def reference_constrained_greedy(model, prompt: torch.Tensor, allowed: list[int] | None, new: int) -> list[int]:
    logits = model(input_ids=prompt).logits[0, -1]
    if allowed is not None:
        masked = torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        logits = masked
    first = int(logits.argmax())
    rest = reference_greedy(model, torch.cat([prompt, torch.tensor([[first]])], dim=1), new - 1)
    return [first] + rest


def allowed_without_argmax(model, prompt: torch.Tensor, size: int = 6, seed: int = 0) -> list[int]:
    """A set of `size` tokens that leaves out the target's unconstrained choice, so the constraint matters."""
    with torch.no_grad():
        best = int(model(input_ids=prompt).logits[0, -1].argmax())
    gen = torch.Generator().manual_seed(seed)
    return [t for t in torch.randperm(VOCAB, generator=gen).tolist() if t != best][:size]


class AnswerDrafter(Drafter):
    """Proposes the given continuation: every draft token is right, the first one included."""

    def __init__(self, answer: list[int]):
        super().__init__()
        self.answer = answer

    def propose(self, state, gamma):
        done = state.tokens.shape[1] - state.prompt_length
        return Draft(tokens=torch.tensor([(self.answer[done:] + [0] * gamma)[:gamma]]))


def constrained_drafter(kind: str, model, answer: list[int]):
    from draftverify.drafters import ModelTreeDrafter

    if kind == "tree":
        return ModelTreeDrafter(perturbed_copy(model, 0.5, seed=1), paths=TREE_PATHS)
    if kind == "answer":
        return AnswerDrafter(answer)
    return make_drafter(kind, model, "llama")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", ["none", "self", "perturbed", "prompt_lookup", "lookup_model", "tree", "answer"])
def test_constrained_first_token_equals_the_targets_constrained_greedy(arch, kind):
    model, plain = target_and_reference(arch)
    allowed = allowed_without_argmax(model, PROMPT)
    expected = reference_constrained_greedy(model, PROMPT, allowed, NEW)
    assert expected[0] in allowed and expected[0] != plain[0] and len(set(expected)) >= 4
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(
        model,
        constrained_drafter(kind, model, expected),
        verifier,
        PROMPT,
        max_new_tokens=NEW,
        gamma=4,
        first_token_allowed=torch.tensor(allowed),
    )
    assert out.new_tokens[0].tolist() == expected
    assert out.stats.new_tokens == NEW
    if kind == "answer":  # the constrained first draft token is accepted like any other
        assert out.stats.rejections == 0


def test_a_set_holding_the_unconstrained_choice_changes_nothing():
    model, plain = target_and_reference("llama")
    out = generate(
        model,
        make_drafter("perturbed", model, "llama"),
        GreedyVerifier(),
        PROMPT,
        max_new_tokens=NEW,
        first_token_allowed=[[plain[0], 1, 2]],
    )
    assert out.new_tokens[0].tolist() == plain


def test_constrained_first_token_in_a_batch_is_per_row_and_joining_rows_get_theirs():
    model, _ = target_and_reference("llama")
    prompts = [PROMPT[0].tolist(), [9, 4, 60], [12, 30], [60, 61, 62, 60]]
    allowed = [allowed_without_argmax(model, torch.tensor([p]), seed=i) for i, p in enumerate(prompts)]
    sets = [allowed[0], None, allowed[2]]  # row 1 unconstrained
    width = max(len(p) for p in prompts[:3])
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts[:3]])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts[:3]])
    pending = [[RowRequest(prompts[3], 12, first_token_allowed=allowed[3])]]
    out = generate(
        model,
        make_drafter("perturbed", model, "llama"),
        GreedyVerifier(),
        ids,
        max_new_tokens=[16, 10, 6],
        gamma=3,
        attention_mask=mask,
        first_token_allowed=sets,
        admit=lambda: pending.pop(0) if pending else [],
    )
    limits = [16, 10, 6, 12]
    for row, (prompt, constraint, limit) in enumerate(zip(prompts, sets + [allowed[3]], limits)):
        expected = reference_constrained_greedy(model, torch.tensor([prompt]), constraint, limit)
        assert out.rows[row] == expected, row
    with torch.no_grad():
        free = int(model(input_ids=torch.tensor([prompts[1]])).logits[0, -1].argmax())
    assert out.rows[1][0] == free


@pytest.mark.parametrize("coupling", [False, True])
def test_sampled_first_token_is_always_allowed_and_follows_the_renormalised_distribution(coupling):
    from conftest import chi2_critical, chi2_statistic

    model, _ = target_and_reference("gpt2")
    drafter = ModelDrafter(perturbed_copy(model, 1.0, seed=3))
    verifier = GumbelCouplingVerifier() if coupling else SpeculativeSamplingVerifier()
    with torch.no_grad():
        p = model(input_ids=PROMPT).logits[0, -1].softmax(-1)
    allowed = sorted(torch.topk(p, 12).indices.tolist()[2:])  # the two likeliest tokens left out
    renormalised = torch.zeros_like(p)
    renormalised[allowed] = p[allowed] / p[allowed].sum()
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    draws = 300
    for seed in range(draws):
        out = generate(
            model,
            drafter,
            verifier,
            PROMPT,
            SamplingParams(1.0, seed=seed, coupling=coupling),
            max_new_tokens=1,
            gamma=1,
            first_token_allowed=torch.tensor(allowed),
        )
        counts[out.new_tokens[0, 0]] += 1
    assert counts[[t for t in range(VOCAB) if t not in allowed]].sum() == 0
    assert chi2_statistic(counts, renormalised) < chi2_critical(counts, renormalised)


@pytest.mark.parametrize(
    "allowed, match",
    [
        (torch.tensor([], dtype=torch.long), "empty"),
        (torch.tensor([VOCAB]), r"\[0, 96\)"),
        ([[1], [2]], "2 entries for 1 rows"),
    ],
)
def test_bad_first_token_sets_are_clear_errors(allowed, match):
    model, _ = target_and_reference("llama")
    with pytest.raises(DraftVerifyError, match=match):
        generate(model, NoDrafter(), GreedyVerifier(), PROMPT, max_new_tokens=2, first_token_allowed=allowed)
