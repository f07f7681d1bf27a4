"""CrossTokenizerDrafter: a draft model with its own tokenizer drafts for any target, and the output stays exact.

Greedy: the text is the target's own greedy text (tiny random models with two different byte-level BPEs, and the
code zoo's target with its 2048-token draft). Sampling: the drafter's proposal is deterministic (q one-hot), and
speculative sampling over it emits tokens distributed as p (chi-square); treating the same proposal as a draw from
a soft q is shown to fail the same check. Plus: the draft's ids are kept incrementally and a token straddling the
boundary is re-merged, and a draft that cannot be used is refused with one line naming the problem.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import chi2_critical, chi2_statistic, reference_greedy
from draftverify.api import load
from draftverify.drafters import CrossTokenizerDrafter, ModelDrafter
from draftverify.drafters.retokenize import TokenBytes
from draftverify.errors import DraftVerifyError
from draftverify.loop import generate
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.types import DecodingState, Draft, SamplingParams
from draftverify.verifiers import SpeculativeSamplingVerifier
from tokenizer_pairs import draft_tokenizer, gpt2, llama, save, target_tokenizer

torch.set_num_threads(1)

PROMPTS = ["def forward(self, x):\n", "import torch\n\n\nclass Cache:\n    def __init__(self, size):\n        self."]
ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"
_models: dict = {}


def target():
    if "target" not in _models:
        _models["target"] = llama(len(target_tokenizer()), seed=1)
    return _models["target"]


def draft():
    if "draft" not in _models:
        _models["draft"] = gpt2(len(draft_tokenizer()), seed=0)
    return _models["draft"]


def drafter(model=None, tokenizer=None) -> CrossTokenizerDrafter:
    return CrossTokenizerDrafter(
        model if model is not None else draft(),
        tokenizer or draft_tokenizer(),
        target_tokenizer(),
        len(target_tokenizer()),
    )


def prompt_ids(text: str) -> torch.Tensor:
    return target_tokenizer()(text, return_tensors="pt").input_ids  # [1, L]


def exact(params: SamplingParams):
    return build_verifier("exact", params, MethodOptions())


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


@pytest.mark.parametrize("gamma", [1, 3, 6, "auto", "conf"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_is_the_targets_own_greedy_text(prompt, gamma):
    ids = prompt_ids(prompt)
    reference = reference_greedy(target(), ids, 40)
    assert len(set(reference)) > 8  # varied text, so equality is not vacuous
    out = generate(target(), drafter(), exact(SamplingParams()), ids, max_new_tokens=40, gamma=gamma)
    assert out.new_tokens[0].tolist() == reference
    assert out.stats.drafted_tokens > 0 and out.stats.draft_calls > 0


def test_the_target_as_its_own_draft_keeps_most_drafts():
    """Same model and tokenizer through the cross-tokenizer path: its drafts are the target's own text, so most
    are kept (the boundary handling loses only the dropped last token and re-merged tokens)."""
    ids = prompt_ids(PROMPTS[1])
    out = generate(
        target(), drafter(target(), target_tokenizer()), exact(SamplingParams()), ids, max_new_tokens=48, gamma=4
    )
    assert out.new_tokens[0].tolist() == reference_greedy(target(), ids, 48)
    assert out.stats.alpha > 0.6 and out.stats.tokens_per_call > 2.0


def test_the_draft_keeps_its_ids_incrementally(monkeypatch):
    """After the prompt, only a short window is encoded again each step, and the draft's ids spell the text."""
    cross = drafter()
    encoded: list[int] = []
    original = TokenBytes.encode

    def spy(self, text):
        if self is cross.draft:
            encoded.append(len(text))
        return original(self, text)

    monkeypatch.setattr(TokenBytes, "encode", spy)
    ids = prompt_ids(PROMPTS[1])
    out = generate(target(), cross, exact(SamplingParams()), ids, max_new_tokens=64, gamma=4)
    text = cross.target.bytes_of(out.sequences[0].tolist())
    assert encoded[0] == len(PROMPTS[1]) and len(text) > 2 * len(PROMPTS[1])
    assert max(encoded[1:]) < 64 < len(text)  # windows, never the whole text again
    state = DecodingState(
        tokens=out.sequences, source_ids=None, prompt_length=ids.shape[1], params=SamplingParams(), generator=None
    )
    cut = cross._sync(state)
    assert cut is not None and bytes(cross.spelled) == text
    assert cross.draft.bytes_of(cross.track.ids) == text


def test_a_token_straddling_the_boundary_is_re_merged():
    """The committed text ends in " re"; the next target tokens spell "turn y": the draft's " re" becomes its
    " return", as its tokenizer tokenizes the running text."""
    tt, dt = target_tokenizer(), draft_tokenizer()
    cross = drafter()
    first, rest = tt("if x: re").input_ids, tt("turn y\n").input_ids
    state = DecodingState(
        tokens=torch.tensor([first]), source_ids=None, prompt_length=len(first), params=SamplingParams(), generator=None
    )
    cross.start(state)
    cross.propose(state, 3)
    assert cross.track.ids[: len(dt("if x: re").input_ids)] == dt("if x: re").input_ids
    state.tokens = torch.tensor([first + rest])
    assert cross._sync(state) is not None
    assert cross.track.ids == dt("if x: return y\n").input_ids
    assert " return" in dt.convert_tokens_to_string(dt.convert_ids_to_tokens(cross.track.ids[-4:]))


# ---- sampling: a deterministic proposal, verified with q one-hot, is lossless ----------------------------------

B = 40_000


def _peaked():
    if "peaked" not in _models:
        _models["peaked"] = llama(len(target_tokenizer()), seed=1, scale=6.0)
    return _models["peaked"]


def _proposal_and_logits(params: SamplingParams, own_draft: bool = True):
    """The drafter's proposal x [1, N] and the target's logits at the pending token and x [1, N+1, V]. A peaked
    target (weights x6) drafting for itself through the cross-tokenizer path gives proposals it likes, so later
    positions are reached; own_draft False: the other-tokenizer draft (only the first position is reached)."""
    peaked = _peaked()
    ids = prompt_ids("    def ")
    cross = drafter(peaked, target_tokenizer()) if own_draft else drafter()
    state = DecodingState(
        tokens=ids,
        source_ids=None,
        prompt_length=ids.shape[1],
        params=params,
        generator=torch.Generator().manual_seed(0),
    )
    cross.start(state)
    proposal = cross.propose(state, 3)
    assert proposal.q_probs is None and proposal.length >= 1  # deterministic, as prompt lookup's
    logits = peaked(torch.cat([ids, proposal.tokens], dim=1)).logits[:, ids.shape[1] - 1 :]  # [1, N+1, V]
    return proposal, logits


def _emitted_statistics(proposal: Draft, logits: torch.Tensor, params: SamplingParams, q_probs) -> list[tuple]:
    """B independent verifications of the same proposal: (position, chi-square, critical value) for every position
    reached by at least 2000 rows, the emitted token tested against p at that position."""
    n = proposal.length
    rows = Draft(tokens=proposal.tokens.expand(B, n), q_probs=q_probs)
    verdict = SpeculativeSamplingVerifier().verify(
        rows, logits.expand(B, n + 1, -1), params, torch.Generator().manual_seed(1)
    )
    p = torch.softmax(logits[0].double() / params.temperature, dim=-1)  # [N+1, V]
    out = []
    for j in range(n + 1):
        reached = verdict.num_accepted >= j
        if int(reached.sum()) < 2000:
            continue
        counts = torch.bincount(verdict.tokens[reached, j], minlength=p.shape[-1]).double()
        out.append((j, chi2_statistic(counts, p[j]), chi2_critical(counts, p[j])))
    return out


@pytest.mark.parametrize("own_draft, positions", [(True, [0, 1, 2]), (False, [0])])
def test_sampling_over_the_one_hot_proposal_follows_the_target(own_draft, positions):
    params = SamplingParams(temperature=0.8)
    proposal, logits = _proposal_and_logits(params, own_draft)
    results = _emitted_statistics(proposal, logits, params, proposal.q_probs)
    assert [j for j, _, _ in results][: len(positions)] == positions  # the first token, and after acceptances
    for j, stat, critical in results:
        assert stat < critical, f"position {j}: chi-square {stat:.1f} >= {critical:.1f}"


def test_a_wrong_rule_fails_the_same_check():
    """Treating the proposal as a draw from a soft q (the draft's confidence 0.5 on x, the rest spread evenly)
    accepts x too often: the emitted tokens are no longer distributed as p."""
    params = SamplingParams(temperature=0.8)
    proposal, logits = _proposal_and_logits(params)
    n, vocab = proposal.length, logits.shape[-1]
    soft = torch.full((1, n, vocab), 0.5 / (vocab - 1), dtype=torch.float64)
    soft.scatter_(-1, proposal.tokens[..., None], 0.5)
    results = _emitted_statistics(proposal, logits, params, soft.expand(B, n, vocab))
    assert max(stat / critical for _, stat, critical in results) > 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_sampling_gives_the_targets_own_sample(seed):
    """Coupled sampling emits the target's own position-keyed draws: the same text as plain decoding."""
    ids = prompt_ids(PROMPTS[0])
    params = SamplingParams(temperature=0.9, seed=seed)
    plain = generate(
        target(), build_drafter("none", None, MethodOptions()), exact(params), ids, params, max_new_tokens=32
    )
    crossed = generate(target(), drafter(), exact(params), ids, params, max_new_tokens=32, gamma=3)
    assert crossed.new_tokens.tolist() == plain.new_tokens.tolist()


def test_uncoupled_sampling_runs_speculative_sampling():
    ids = prompt_ids("    def ")
    params = SamplingParams(temperature=0.8, seed=1, coupling=False)  # seeded: the same run every time
    verifier = exact(params)
    peaked = _peaked()
    out = generate(peaked, drafter(peaked, target_tokenizer()), verifier, ids, params, max_new_tokens=32, gamma=3)
    assert verifier.name == "speculative_sampling" and out.stats.new_tokens == 32 and out.stats.accepted_tokens > 0


def test_a_batch_is_refused():
    ids = prompt_ids(PROMPTS[0]).expand(2, -1)
    with pytest.raises(DraftVerifyError, match="one row at a time"):
        generate(target(), drafter(), exact(SamplingParams()), ids, max_new_tokens=4)


# ---- through load(): the wrapper is picked when the vocabularies differ; unusable drafts are refused ----------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross")
    save(target(), target_tokenizer(), root / "target")
    save(draft(), draft_tokenizer(), root / "draft")
    save(draft(), None, root / "draft-without-tokenizer")
    save(llama(len(target_tokenizer()), seed=5), None, root / "same-vocab-without-tokenizer")
    save(llama(len(target_tokenizer()), seed=6), target_tokenizer(), root / "same-tokenizer")
    return root


def test_load_picks_the_cross_tokenizer_drafter_for_another_vocabulary(folders):
    pipe = load(target=folders / "target", draft=folders / "draft", method="model")
    assert isinstance(pipe.drafter, CrossTokenizerDrafter)
    baseline = load(target=folders / "target", method="autoregressive").generate(PROMPTS[0], max_new_tokens=24)
    result = pipe.generate(PROMPTS[0], max_new_tokens=24)
    assert result.text == baseline.text
    assert result.stats.drafted_tokens > 0 and 0 < result.stats.time_retokenize < result.stats.time_draft
    assert result.stats.as_dict()["time_retokenize"] == result.stats.time_retokenize


@pytest.mark.parametrize("folder", ["same-vocab-without-tokenizer", "same-tokenizer"])
def test_a_draft_with_the_targets_vocabulary_keeps_the_model_drafter(folders, folder):
    pipe = load(target=folders / "target", draft=folders / folder, method="model")
    assert type(pipe.drafter) is ModelDrafter


def test_a_draft_with_another_vocabulary_and_no_tokenizer_is_refused(folders):
    with pytest.raises(
        DraftVerifyError,
        match=r"another vocabulary than the target \(300 vs 420 output logits\) "
        r"and no tokenizer files",
    ) as err:
        load(target=folders / "target", draft=folders / "draft-without-tokenizer", method="model")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "method, message",
    [
        ("lookup_model", "'lookup_model' drafter reads its probabilities"),
        ("model_tree", "'model_tree' drafter reads its probabilities"),
    ],
)
def test_methods_that_read_the_drafts_logits_refuse_another_vocabulary(folders, method, message):
    with pytest.raises(DraftVerifyError, match=message):
        load(target=folders / "target", draft=folders / "draft", method=method)


def test_bild_fallback_is_refused_with_another_vocabulary(folders):
    with pytest.raises(DraftVerifyError, match="alpha_fb"):
        load(target=folders / "target", draft=folders / "draft", method="bild", alpha_fb=0.5)


def test_an_encoder_decoder_draft_is_refused(tmp_path):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=len(draft_tokenizer()),
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=0,
    )
    with pytest.raises(
        DraftVerifyError, match="encoder-decoder model; a draft with its own tokenizer must be a decoder-only"
    ):
        drafter(T5ForConditionalGeneration(cfg).eval())


def test_cli_generates_with_a_draft_of_another_tokenizer(folders):
    from typer.testing import CliRunner

    from draftverify.cli import app

    args = ["generate", "--target", str(folders / "target"), "--prompt", PROMPTS[0], "-n", "12", "--draft"]
    result = CliRunner().invoke(app, args + [str(folders / "draft")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(PROMPTS[0]) and "of which re-tokenizing" in result.stderr
    refused = CliRunner().invoke(app, args + [str(folders / "draft-without-tokenizer")])
    assert refused.exit_code == 2 and "no tokenizer files to translate between them" in refused.stderr
    assert "Traceback" not in refused.output


def test_the_server_answers_with_a_draft_of_another_tokenizer(folders):
    """One request at a time (the drafter decodes one row); the text is the target's own greedy text."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from draftverify.serve.app import ServerSettings, create_app

    pipe = load(target=folders / "target", draft=folders / "draft", method="model")
    assert not pipe.supports_batches
    expected = load(target=folders / "target", method="autoregressive").generate(PROMPTS[0], max_new_tokens=12).text
    with TestClient(create_app(pipe, ServerSettings(model_name="tiny", max_batch=4))) as client:
        reply = client.post(
            "/v1/completions", json={"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == expected


# ---- the code zoo: its target with a draft of another tokenizer (zoo/code/draft-othertok) ----------------------


def test_zoo_target_with_a_draft_of_another_tokenizer():
    prompt = 'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n'
    pipe = load(target=ZOO / "target", draft=ZOO / "draft-othertok", method="model")
    assert isinstance(pipe.drafter, CrossTokenizerDrafter)
    assert len(pipe.drafter.draft.tokenizer) != len(pipe.tokenizer)
    baseline = load(target=ZOO / "target", method="autoregressive").generate(prompt, max_new_tokens=32)
    result = pipe.generate(prompt, max_new_tokens=32)
    assert result.text == baseline.text
    assert result.stats.accepted_tokens > 0 and result.stats.tokens_per_call > 1.0


def test_the_loop_itself_reports_the_time_spent_re_tokenizing():
    """loop.generate, not only the Pipeline, adds the drafter's own timers to the stats."""
    out = generate(target(), drafter(), exact(SamplingParams()), prompt_ids(PROMPTS[0]), max_new_tokens=16, gamma=3)
    assert 0 < out.stats.time_retokenize < out.stats.time_draft
