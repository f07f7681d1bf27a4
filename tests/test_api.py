"""load() / Pipeline: models from disk, methods by name, text in and text out, clear errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from conftest import save_llama
from draftverify import DraftVerifyError, SamplingParams
from draftverify.api import load, zoo_paths
from draftverify.drafters import NgramTable

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "zoo" / "code" / "tokenizer"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    root = tmp_path_factory.mktemp("models")
    save_llama(root / "target", layers=3, seed=0, tokenizer=tokenizer, context=512)
    save_llama(root / "draft", layers=1, seed=1, tokenizer=tokenizer, context=512)
    ids = tokenizer("def f(x):\n    return x + 1\n" * 3).input_ids
    NgramTable.from_sequences([ids], order=3, vocab_size=len(tokenizer)).save(root / "ngram.safetensors")
    return root


PROMPT = "def quicksort(xs):\n    "


@pytest.mark.parametrize(
    "method", ["model", "prompt_lookup", "lookup_model", "ngram", "early_exit", "model_tree", "prompt_lookup_tree"]
)
def test_lossless_methods_give_the_autoregressive_text(model_dirs, method):
    baseline = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=24)
    pipe = load(
        target=model_dirs / "target",
        draft=model_dirs / "draft",
        method=method,
        ngram_path=model_dirs / "ngram.safetensors",
        early_exit_layers=1,
    )
    result = pipe.generate(PROMPT, max_new_tokens=24)
    assert result.text == baseline.text
    assert result.stats.new_tokens == baseline.stats.new_tokens
    assert baseline.stats.drafted_tokens == 0 and result.stats.drafted_tokens > 0


def test_streamed_text_equals_the_returned_text(model_dirs):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model")
    pieces: list[str] = []
    result = pipe.generate(PROMPT, max_new_tokens=24, on_text=pieces.append)
    assert "".join(pieces) == result.text


def test_sampling_through_the_pipeline_is_seeded(model_dirs):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model")
    a = pipe.generate(PROMPT, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=3)
    b = pipe.generate(PROMPT, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=3)
    assert a.text == b.text
    others = {pipe.generate(PROMPT, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=s).text for s in (4, 5, 6)}
    assert len(others | {a.text}) >= 3  # the seed (so sampling) really decides the text
    greedy = pipe.generate(PROMPT, max_new_tokens=16).text
    assert a.text != greedy
    assert pipe.verifier_name == "exact" and a.verifier == "gumbel_coupling"  # resolved per call
    assert pipe.generate(PROMPT, max_new_tokens=4, temperature=1.0).verifier == "speculative_sampling"
    plain = [
        pipe.generate(PROMPT, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=3, coupling=False) for _ in range(2)
    ]
    assert plain[0].verifier == "speculative_sampling" and plain[0].text == plain[1].text  # seeded, fixed gamma
    assert pipe.generate(PROMPT, max_new_tokens=4).verifier == "greedy"


@pytest.mark.parametrize("gamma", [2, "auto"])
def test_a_seed_gives_the_same_text_for_every_method_and_draft_length(model_dirs, gamma):
    expected = (
        load(target=model_dirs / "target", method="autoregressive")
        .generate(PROMPT, max_new_tokens=24, temperature=0.8, seed=7)
        .text
    )
    for method in ("model", "prompt_lookup", "lookup_model", "ngram"):
        pipe = load(
            target=model_dirs / "target",
            draft=model_dirs / "draft",
            method=method,
            gamma=gamma,
            ngram_path=model_dirs / "ngram.safetensors",
        )
        for _ in range(2):  # the second call starts from the pipeline's calibrated costs: other draft lengths
            assert pipe.generate(PROMPT, max_new_tokens=24, temperature=0.8, seed=7).text == expected, method


def test_gamma_auto_keeps_its_cost_calibration_across_calls(model_dirs):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model", gamma="auto")
    pipe.generate(PROMPT, max_new_tokens=24)
    calls = pipe.step_costs.calls
    assert calls > 0
    pipe.generate(PROMPT, max_new_tokens=24)
    assert pipe.step_costs.calls > calls


def test_auto_and_conf_keep_their_policy_across_calls_one_per_temperature(model_dirs):
    """The learning policies are made once per (gamma, temperature) and kept, with what they measured; a fixed
    gamma is made fresh each call; a policy passed in is used as it is."""
    from draftverify.draft_length import ConfidenceGamma, FixedGamma

    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model", gamma="conf")
    pipe.generate(PROMPT, max_new_tokens=24)
    policy = pipe.policies.get("conf", 0.0)
    assert isinstance(policy, ConfidenceGamma)
    judged = sum(policy.sure.trials) + sum(policy.unsure.trials)
    assert judged > 0  # the first call's rates are in it
    pipe.generate(PROMPT, max_new_tokens=24)
    assert pipe.policies.get("conf", 0.0) is policy and sum(policy.sure.trials) + sum(policy.unsure.trials) > judged
    assert pipe.policies.get("conf", 0.8) is not policy  # sampling measures its own rates
    assert pipe.policies.get("auto", 0.0).costs is policy.costs  # one pipeline, one set of timings
    assert isinstance(pipe.policies.get(3, 0.0), FixedGamma) and pipe.policies.get(3, 0.0) is not pipe.policies.get(
        3, 0.0
    )
    mine = ConfidenceGamma(0.5, fixed=4)
    assert pipe.policies.get(mine) is mine


@pytest.mark.parametrize("method", ["autoregressive", "model", "lookup_model"])
def test_a_list_of_prompts_runs_as_one_batch_with_each_text_its_own(model_dirs, method):
    prompts = [PROMPT, "import os\nimport sys", "x", PROMPT]
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method=method)
    alone = [pipe.generate(p, max_new_tokens=20).text for p in prompts]
    results = pipe.generate(prompts, max_new_tokens=20)
    assert [r.text for r in results] == alone
    assert results[0].stats.target_calls < sum(pipe.generate(p, max_new_tokens=20).stats.target_calls for p in prompts)
    seeded_alone = [pipe.generate(p, max_new_tokens=12, temperature=0.8, seed=s).text for s, p in enumerate(prompts)]
    seeded = pipe.generate(prompts, max_new_tokens=12, temperature=0.8, seed=list(range(len(prompts))))
    assert [r.text for r in seeded] == seeded_alone


def test_batches_of_one_row_methods_are_clear_errors(model_dirs):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="bild")
    with pytest.raises(DraftVerifyError, match="one row at a time"):
        pipe.generate([PROMPT, "x"], max_new_tokens=4)
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match="2 seeds for 3 prompts"):
        pipe.generate(["a", "b", "c"], max_new_tokens=4, temperature=1.0, seed=[1, 2])
    with pytest.raises(DraftVerifyError, match="list of prompts is empty"):
        pipe.generate([], max_new_tokens=4)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("def f(\ud800x):", "unpaired surrogate"),
        (b"def f(x):", "must be a str"),
    ],
)
def test_bad_prompts_name_the_problem(model_dirs, prompt, message):
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match=message):
        pipe.generate(prompt, max_new_tokens=4)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=1.0, seed="abc"), "seed must be an integer"),
        (dict(temperature=1.0, seed=1.5), "seed must be an integer"),
        (dict(temperature=float("inf")), "finite"),
        (dict(temperature=1.0, coupling="yes"), "coupling must be"),
    ],
)
def test_bad_sampling_settings_name_the_problem(model_dirs, settings, message):
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match=message):
        pipe.generate(PROMPT, max_new_tokens=4, **settings)


def test_folder_without_tokenizer_and_non_table_ngram_are_clear_errors(model_dirs, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((model_dirs / "target" / name).read_bytes())
    with pytest.raises(DraftVerifyError, match="has no tokenizer files"):
        load(target=bare, method="autoregressive")
    with pytest.raises(DraftVerifyError, match="not an n-gram table"):
        load(target=model_dirs / "target", method="ngram", ngram_path=model_dirs / "target" / "model.safetensors")


def test_hub_id_with_the_hub_unreachable_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9: refused at once
    started = time.perf_counter()
    with pytest.raises(DraftVerifyError, match="hub cannot be reached .*not in the local cache"):
        load(target="draftverify-tests/no-such-model", method="autoregressive")
    assert time.perf_counter() - started < 10  # no retry loop


def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(DraftVerifyError, match="could not load the target model"):
        load(target=tmp_path / "nope", method="autoregressive")


def test_unknown_method_lists_the_choices(model_dirs):
    with pytest.raises(DraftVerifyError, match="unknown method 'medusa'.*prompt_lookup"):
        load(target=model_dirs / "target", method="medusa")


def test_unknown_verifier_lists_the_choices(model_dirs):
    pipe = load(target=model_dirs / "target", method="autoregressive", verifier="nucleus")
    with pytest.raises(DraftVerifyError, match="unknown verifier 'nucleus'.*topbeta"):
        pipe.generate(PROMPT, max_new_tokens=4)


def test_model_method_without_draft_says_what_to_pass(model_dirs):
    with pytest.raises(DraftVerifyError, match="needs a draft model"):
        load(target=model_dirs / "target", method="model")


def test_ngram_method_without_table_says_what_to_pass(model_dirs):
    with pytest.raises(DraftVerifyError, match="needs a table"):
        load(target=model_dirs / "target", method="ngram")


def test_unknown_option_is_rejected(model_dirs):
    with pytest.raises(DraftVerifyError, match="unknown option"):
        load(target=model_dirs / "target", method="autoregressive", alpha_fallback=0.5)


def test_empty_prompt_is_rejected(model_dirs):
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match="prompt is empty"):
        pipe.generate("", max_new_tokens=4)


@pytest.mark.parametrize("prompt", ["   ", "\n\t", " " * 50])
def test_a_whitespace_only_prompt_is_rejected(model_dirs, prompt):
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match="only whitespace"):
        pipe.generate(prompt, max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="only whitespace"):
        pipe.generate(["def f(x):", prompt], max_new_tokens=4)


def test_gamma_is_bounded_before_loading_and_by_the_target_context(model_dirs, tmp_path):
    started = time.perf_counter()
    with pytest.raises(DraftVerifyError, match=r"gamma \(draft length\) 1000 is above 64.*'auto'"):
        load(target=tmp_path / "not-loaded", method="prompt_lookup", gamma=1000)  # fails before any file is read
    assert time.perf_counter() - started < 1
    assert load(target=model_dirs / "target", method="prompt_lookup", gamma=64).gamma == 64
    pipe = load(target=model_dirs / "target", method="prompt_lookup", gamma=4)
    with pytest.raises(DraftVerifyError, match="above 64"):
        pipe.generate(PROMPT, max_new_tokens=4, gamma=65)
    short = tmp_path / "short"
    save_llama(short, layers=1, seed=0, tokenizer=AutoTokenizer.from_pretrained(model_dirs / "target"), context=16)
    with pytest.raises(DraftVerifyError, match="above 15, the target attends to 16 positions"):
        load(target=short, method="prompt_lookup", gamma=16)
    assert load(target=short, method="prompt_lookup", gamma=15).gamma == 15


@pytest.mark.parametrize("method", ["specdec", "specdec++_nat"])
def test_a_nat_method_on_a_zoo_without_a_drafter_says_which_zoo_has_one_and_how_to_train_one(
    method, code_zoo_without_nat
):
    started = time.perf_counter()
    with pytest.raises(DraftVerifyError) as caught:
        load(zoo="code", method=method)
    message = str(caught.value)
    assert "'code' zoo ships no NAT drafter" in message and "only the translate zoo ships one" in message
    assert "draftverify train nat --target zoo/code/target" in message and "\n" not in message
    assert time.perf_counter() - started < 2  # said before any model loads


def test_load_is_quiet_by_default_verbose_on_request_and_leaves_transformers_settings_as_found(
    model_dirs, capfd, monkeypatch
):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("DRAFTVERIFY_VERBOSE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.enable_progress_bar()  # as a fresh process has them (a CLI test in this process turned them off)
    hf_logging.set_verbosity_warning()
    try:
        capfd.readouterr()
        load(target=model_dirs / "target", draft=model_dirs / "draft", method="model")
        quiet = capfd.readouterr()
        assert quiet.err == "" and quiet.out == ""
        assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == hf_logging.WARNING
        load(target=model_dirs / "target", method="autoregressive", verbose=True)
        assert "Loading weights" in capfd.readouterr().err
        monkeypatch.setenv("DRAFTVERIFY_VERBOSE", "1")
        load(target=model_dirs / "target", method="autoregressive")
        assert "Loading weights" in capfd.readouterr().err
        monkeypatch.delenv("DRAFTVERIFY_VERBOSE")
        hf_logging.set_verbosity_info()  # a level the user chose is theirs: kept through load
        load(target=model_dirs / "target", method="autoregressive")
        assert hf_logging.get_verbosity() == hf_logging.INFO and hf_logging.is_progress_bar_enabled()
        assert "Loading weights" not in capfd.readouterr().err
    finally:
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        hf_logging.set_verbosity(level)


def test_unknown_zoo_entry_lists_what_exists():
    with pytest.raises(DraftVerifyError, match="no zoo entry 'nope'"):
        zoo_paths("nope")


def test_top_level_load_is_the_api_load():
    import draftverify

    assert draftverify.load is load


def test_compile_option_reaches_target_and_draft(model_dirs):
    """Only the construction: compiled generation itself is covered in test_cached_lm and test_cli."""
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model_tree", compile=True)
    assert pipe.target.capacity == 512 and pipe.drafter.lm.capacity == 512  # the models' context length
    assert pipe.options.compile
    plain = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model")
    assert plain.target.capacity is None and plain.drafter.lm.name == "lean"  # eager drafts run on LeanLM
    hf_draft = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model", lean_draft=False)
    assert hf_draft.drafter.lm.capacity is None


# ---------------------------------------------------------------- token healing through the Pipeline

HEAL_PROMPT = 'def add(a, b):\n    """Add two numbers."""\n'


def healed_reference(model_dirs, prompt: str, new: int) -> tuple[list[int], str]:
    """Computed here without draftverify: back up over the last token, let the first new token be any token whose
    own text starts with the removed text (brute force over the vocabulary), greedy after that."""
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import reference_greedy

    tokenizer = AutoTokenizer.from_pretrained(model_dirs / "target")
    model = AutoModelForCausalLM.from_pretrained(model_dirs / "target").eval()
    ids = tokenizer(prompt).input_ids
    removed = tokenizer.decode(ids[-1:])
    allowed = [
        i
        for i in range(len(tokenizer))
        if i not in tokenizer.all_special_ids and tokenizer.decode([i]).startswith(removed)
    ]
    backed = torch.tensor([ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=backed).logits[0, -1]
    first = max(allowed, key=lambda i: float(logits[i]))
    new_ids = [first] + reference_greedy(model, torch.cat([backed, torch.tensor([[first]])], dim=1), new - 1)
    text = tokenizer.decode(new_ids)
    assert text.startswith(removed)
    return new_ids, text[len(removed) :]


@pytest.mark.parametrize("method", ["autoregressive", "model", "prompt_lookup", "lookup_model", "model_tree"])
def test_healed_text_is_the_targets_constrained_greedy_after_the_original_prompt(model_dirs, method):
    new_ids, text = healed_reference(model_dirs, HEAL_PROMPT, 16)
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method=method, heal=True)
    pieces: list[str] = []
    result = pipe.generate(HEAL_PROMPT, max_new_tokens=16, on_text=pieces.append)
    assert result.output.new_tokens[0].tolist() == new_ids
    assert result.text == text and "".join(pieces) == text
    tokenizer = pipe.tokenizer
    assert HEAL_PROMPT + result.text == tokenizer.decode(tokenizer(HEAL_PROMPT).input_ids[:-1] + new_ids)
    assert result.stats.new_tokens == 16  # the healed token is one of the new tokens
    assert result.stats.prompt_tokens == len(tokenizer(HEAL_PROMPT).input_ids) - 1


def test_healing_is_off_by_default_in_the_api_and_per_call_wins(model_dirs):
    plain = load(target=model_dirs / "target", method="autoregressive")
    assert plain.heal is False
    healed = load(target=model_dirs / "target", method="autoregressive", heal=True)
    assert (
        healed.generate(HEAL_PROMPT, max_new_tokens=12, heal=False).text
        == plain.generate(HEAL_PROMPT, max_new_tokens=12).text
    )
    assert (
        plain.generate(HEAL_PROMPT, max_new_tokens=12, heal=True).text
        == healed.generate(HEAL_PROMPT, max_new_tokens=12).text
    )
    assert (
        healed.generate(HEAL_PROMPT, max_new_tokens=12).output.new_tokens[0].tolist()
        == healed_reference(model_dirs, HEAL_PROMPT, 12)[0]
    )
    with pytest.raises(DraftVerifyError, match="heal must be True or False"):
        load(target=model_dirs / "target", method="autoregressive", heal="yes")


def test_a_batch_heals_each_row_on_its_own(model_dirs):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method="model", heal=True)
    prompts = [HEAL_PROMPT, "def quicksort(xs):", "import os\n\n"]
    singles = [pipe.generate(p, max_new_tokens=8).text for p in prompts]
    assert [r.text for r in pipe.generate(prompts, max_new_tokens=8)] == singles


def test_healing_an_encoder_decoder_target_is_a_clear_error():
    from conftest import build_model
    from draftverify.api import Pipeline

    with pytest.raises(DraftVerifyError, match="encoder-decoder"):
        Pipeline(build_model("t5"), tokenizer=None, method="autoregressive", heal=True)


def test_a_compiled_pipeline_decodes_one_row_at_a_time(model_dirs):
    """Compiled models preallocate a one-row cache: the server then serves one request at a time."""
    assert load(target=model_dirs / "target", method="prompt_lookup").supports_batches
    assert not load(target=model_dirs / "target", method="prompt_lookup", compile=True).supports_batches


def test_per_row_sampling_settings_of_the_wrong_count_or_type_are_clear_errors(model_dirs):
    pipe = load(target=model_dirs / "target", method="autoregressive")
    with pytest.raises(DraftVerifyError, match="1 sampling settings for 2 prompts"):
        pipe.generate_batch_ids([[5, 6], [7, 8]], [SamplingParams()], max_new_tokens=4)
    with pytest.raises(DraftVerifyError, match="must be a SamplingParams, got str"):
        pipe.generate_batch_ids([[5, 6], [7, 8]], ["x", "y"], max_new_tokens=4)
