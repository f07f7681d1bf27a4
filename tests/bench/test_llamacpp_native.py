"""llama.cpp's own C++ speculative decoding rows (`llamacpp_native[...]`): specs parsed and refused with one line,
the tools found or a one-line error naming the build script, and on the zoo's code target the native rows give
our llama.cpp backend's greedy text (skipped, with the reason, without the tools or the llamacpp extra)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bench_fixtures import model_dir  # noqa: F401  (fixture)
from typer.testing import CliRunner

from draftverify.backends import gguf
from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench import llamacpp_native
from draftverify.bench.config import BenchConfig, parse_runners
from draftverify.bench.llamacpp_native import BUILD_SCRIPT, TOOLS_ENV, measurement, tools_dir
from draftverify.bench.native_spec import DEFAULT_SPECS, NativeSpec, native_specs, parse_spec
from draftverify.bench.report import head_to_head
from draftverify.bench.rounds import family, parse_pairs
from draftverify.cli import app
from draftverify.errors import DraftVerifyError

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"


def test_specs_parse_to_canonical_rows_and_llama_cpp_flags():
    chain = parse_spec("llamacpp_native[ngram-mod,draft-simple,p_min=0.75,n_max=16,draft=aligned]")
    assert chain == NativeSpec(("ngram-mod", "draft-simple"), n_max=16, p_min=0.75, draft="aligned")
    assert chain.name == "llamacpp_native[ngram-mod,draft-simple,n_max=16,p_min=0.75,draft=aligned]"
    assert chain.group == "llamacpp_native[ngram-mod,draft-simple]"
    args = chain.server_args(Path("d.gguf"), threads=2)
    assert args[:2] == ["--spec-type", "ngram-mod,draft-simple"]
    assert args[args.index("--spec-draft-model") + 1] == "d.gguf"
    assert args[args.index("--spec-draft-n-max") + 1] == "16" and args[args.index("--spec-draft-p-min") + 1] == "0.75"
    plain = parse_spec("llamacpp_native[plain]")
    assert plain == NativeSpec() and plain.name == "llamacpp_native[plain]" and plain.server_args(None, 2) == []
    assert parse_spec("llamacpp_native[ngram-map-k]").server_args(None, 2) == ["--spec-type", "ngram-map-k"]
    # a bare family is the default set; a row named twice runs once
    assert [s.name for s in native_specs(("model", "llamacpp_native", "llamacpp_native[plain]"))] == list(DEFAULT_SPECS)


def test_runners_split_at_commas_outside_brackets():
    text = "model,llamacpp_native[draft-simple,n_max=8],llamacpp_native[ngram-mod]"
    assert parse_runners(text) == ("model", "llamacpp_native[draft-simple,n_max=8]", "llamacpp_native[ngram-mod]")
    with pytest.raises(DraftVerifyError, match="unbalanced brackets"):
        parse_runners("llamacpp_native[plain")
    assert parse_pairs("llamacpp:model[conf]/llamacpp_native[ngram-mod,draft-simple]") == [
        ("llamacpp:model[conf]", "llamacpp_native[ngram-mod,draft-simple]")
    ]
    assert family("llamacpp_native[plain]") == "llamacpp_native[plain]" and family("llamacpp:model[g=3]") == "model"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("llamacpp_native[medusa]", "unknown type 'medusa'"),
        ("llamacpp_native[]", "has an empty item"),
        ("llamacpp_native[ngram-mod,n_max=4]", "are draft-simple's and draft-eagle3's settings; add one"),
        ("llamacpp_native[draft-simple,n_max=0]", "n_max must be an integer >= 1"),
        ("llamacpp_native[draft-simple,n_max=x]", "n_max must be int"),
        ("llamacpp_native[draft-simple,p_min=1.5]", "p_min must be a number in [0, 1]"),
        ("llamacpp_native[draft-simple,draft=big]", "draft must be draft or aligned"),
        ("llamacpp_native[draft-simple,temp=1]", "unknown setting 'temp'"),
        ("llamacpp_native[ngram-mod,ngram-mod]", "names ngram-mod twice"),
        ("llamacpp_native[plain,ngram-mod]", "unknown type 'plain'"),
        ("llamacpp_native(plain)", "unknown runner family"),
    ],
)
def test_bad_specs_are_refused_with_one_line(spec, message):
    with pytest.raises(DraftVerifyError, match=re.escape(message)) as err:
        BenchConfig(target="t", quick=True, runners=(spec,)).resolved()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("llamacpp_native[medusa]", "unknown type 'medusa'"),
        ("llamacpp_native[plain", "unbalanced brackets"),
    ],
)
def test_bad_specs_exit_2_through_the_cli_before_any_model_loads(spec, message, tmp_path):
    result = CliRunner().invoke(
        app, ["bench", "speed", "--target", str(tmp_path / "absent"), "--runners", spec, "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_bad_target_gguf_type_exits_2(tmp_path):
    result = CliRunner().invoke(
        app, ["bench", "speed", "--target", str(tmp_path / "absent"), "--target-gguf", "q4_k", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "--target-gguf" in result.output and "q8_0" in result.output, result.output
    assert BenchConfig(target="t", quick=True, target_gguf="q8_0").resolved().target_gguf_type() == "q8_0"
    assert BenchConfig(target="t", quick=True).resolved().target_gguf_type() == "f32"  # --dtype float32's


def test_missing_tools_are_one_line_naming_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv(TOOLS_ENV, str(tmp_path))
    with pytest.raises(DraftVerifyError, match=f"no llama-server; build the tools with {BUILD_SCRIPT}"):
        tools_dir()
    monkeypatch.delenv(TOOLS_ENV)
    monkeypatch.setattr(gguf, "CHECKOUT", tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DraftVerifyError) as err:
        tools_dir()
    assert BUILD_SCRIPT in str(err.value) and TOOLS_ENV in str(err.value) and "\n" not in str(err.value)
    built = tmp_path / ".cache" / "llama.cpp-build" / "bin"
    built.mkdir(parents=True)
    (built / "llama-server").write_text("")
    assert tools_dir() == built


def test_without_the_tools_the_rows_are_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv(TOOLS_ENV, str(tmp_path))
    config = BenchConfig(target="t", quick=True, runners=("llamacpp_native[plain]",)).resolved()
    runners, notes = llamacpp_native.native_runners(config, SimpleNamespace(paths={}, context_limit=None))
    assert runners == [] and len(notes) == 1 and BUILD_SCRIPT in notes[0]
    assert llamacpp_native.native_runners(BenchConfig(target="t", quick=True).resolved(), None) == ([], [])


@pytest.mark.skipif(os.name != "posix", reason="a shell script stands in for llama-server")
def test_llama_server_runs_llama_cpps_own_kernels_not_the_switch_our_rows_set(tmp_path, monkeypatch):
    """The tiled-product switch our rows set on the exact kernels' library (llamacpp_kernels.exact_kernels_setup)
    stays out of llama-server's environment: llama.cpp's own engine runs as a user's shell would start it."""
    from draftverify.backends import llamacpp_kernels

    fake = tmp_path / "llama-server"  # says what it was given, then exits, as a server that cannot start would
    fake.write_text('#!/bin/sh\necho "tiled=${GGML_CPU_TILED_MM-unset}"\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setenv(llamacpp_kernels.TILED_MM_ENV, "1")  # recorded, so the switch set below is undone afterwards
    monkeypatch.delenv(llamacpp_kernels.TILED_MM_ENV)
    monkeypatch.setattr(llamacpp_kernels, "_tiled_off_by_us", False)
    assert llamacpp_kernels.exact_kernels_setup(llamafile=False) and os.environ["GGML_CPU_TILED_MM"] == "0"
    with pytest.raises(DraftVerifyError, match=r"exited \(3\): tiled=unset"):
        llamacpp_native.NativeServer(fake, tmp_path / "model.gguf", 1, 256, [], "fake")


def test_a_reply_counts_calls_from_accepted_drafts_and_stops_at_n():
    timings = {"prompt_ms": 5.0, "predicted_ms": 15.0, "predicted_n": 16, "draft_n": 12, "draft_n_accepted": 9}
    m = measurement({"tokens": list(range(16)), "timings": timings}, 16, wall_seconds=0.03)
    assert m.new_ids == list(range(16)) and m.overshoot == 0 and m.seconds == pytest.approx(0.02)
    assert m.target_calls == 7 and m.drafted == 12 and m.accepted == 9 and m.rejections == 3
    plain = {"prompt_ms": 5.0, "predicted_ms": 15.0, "predicted_n": 16}
    assert measurement({"tokens": list(range(16)), "timings": plain}, 16, 0.03).target_calls == 16
    over = measurement({"tokens": list(range(20)), "timings": {**plain, "predicted_n": 20}}, 16, 0.03)
    assert over.new_ids == list(range(16)) and over.overshoot == 4


def test_the_head_to_head_shows_the_best_row_of_each_native_family():
    def row(runner, family, group, tps, kind="llamacpp"):
        return {
            "runner": runner,
            "family": family,
            "group": group,
            "kind": kind,
            "temperature": 0.0,
            "tokens_per_second": tps,
            "lossless": True,
            "equal_to_baseline": 1.0,
        }

    rows = [
        row("llamacpp:model[conf]", "model", "model", 120.0, kind="ours"),
        row("llamacpp_native[plain]", "llamacpp_native", "llamacpp_native[plain]", 60.0),
        row("llamacpp_native[draft-simple,n_max=4]", "llamacpp_native", "llamacpp_native[draft-simple]", 80.0),
        row("llamacpp_native[draft-simple,n_max=16]", "llamacpp_native", "llamacpp_native[draft-simple]", 100.0),
    ]
    peers = [line[3] for line in head_to_head(rows)]
    assert peers == ["`llamacpp_native[plain]`", "`llamacpp_native[draft-simple,n_max=16]`"]


needs_tools = pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason=f"llama.cpp's tools are not built ({BUILD_SCRIPT}) or the llamacpp extra / converter is absent",
)


@needs_tools
def test_native_rows_give_our_llama_cpp_backends_greedy_text_on_the_zoo(tmp_path_factory, monkeypatch):
    from transformers import AutoTokenizer

    from draftverify.backends.llamacpp import LlamaCppLM, open_gguf
    from draftverify.loop import generate
    from draftverify.methods import MethodOptions, build_drafter, build_verifier
    from draftverify.types import SamplingParams

    if not os.environ.get("DRAFTVERIFY_GGUF_CACHE"):
        monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path_factory.mktemp("native-gguf")))
    tokenizer = AutoTokenizer.from_pretrained(ZOO / "target")
    prompts = ["def fibonacci(n):\n", 'def is_palindrome(s: str) -> bool:\n    """True if s reads the same."""\n']
    target, _ = open_gguf(ZOO / "target", "float32", "target")
    lm = LlamaCppLM(target, role="target", threads=2)
    params = SamplingParams(temperature=0.0)
    ours = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt").input_ids  # [1, L]
        out = generate(
            lm,
            build_drafter("none", lm, MethodOptions()),
            build_verifier("exact", params, MethodOptions()),
            ids,
            params,
            max_new_tokens=16,
            eos_token_id=tokenizer.eos_token_id,
        )
        ours.append((ids, out.new_tokens[0].tolist()))
    config = BenchConfig(
        zoo="code", quick=True, threads=2, runners=("llamacpp_native[plain]", "llamacpp_native[ngram-mod]")
    ).resolved()
    # the rows read only the models' paths and context limit; the HF models need not load
    models = SimpleNamespace(paths={"target": str(ZOO / "target")}, context_limit=None)
    runners, notes = llamacpp_native.native_runners(config, models)
    try:
        assert [r.name for r in runners] == ["llamacpp_native[plain]", "llamacpp_native[ngram-mod]"], notes
        assert runners[1].reference == "llamacpp_native[plain]" and runners[1].group == "llamacpp_native[ngram-mod]"
        for runner in runners:
            for ids, want in ours:
                m = runner.run(ids, 0.0, 0, 16)
                assert m.new_ids == want, runner.name
                assert m.overshoot == 0 and m.seconds > 0 and 1 <= m.target_calls <= len(want)
        with pytest.raises(DraftVerifyError, match="greedy only"):
            runners[0].run(torch.tensor([[1, 2]]), 1.0, 0, 4)
        # a new round of bench rounds: a fresh server (ngram-mod's cache of earlier answers gone), the same text
        old = runners[1].server.process
        runners[1].new_round()
        assert old.poll() is not None and runners[1].server.process.poll() is None
        assert runners[1].run(ours[0][0], 0.0, 0, 16).new_ids == ours[0][1]
    finally:
        for runner in runners:
            runner.close()
    assert all(r.server.process.poll() is not None for r in runners)


@pytest.mark.skipif(
    not (importlib.util.find_spec("llama_cpp") and converter_available()),
    reason="llama-cpp-python not installed or no llama.cpp converter (scripts/fetch_llama_cpp_converter.sh)",
)
def test_a_q8_0_target_reaches_llama_cpps_row_and_ours(model_dir, monkeypatch, tmp_path):  # noqa: F811
    from draftverify.bench.lineup import build_runners
    from draftverify.bench.models import load_models
    from draftverify.bench.runners import install_hooks

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path))
    config = BenchConfig(
        target=model_dir / "target",
        quick=True,
        threads=1,
        backends=("llamacpp",),
        runners=("llamacpp",),
        target_gguf="q8_0",
    ).resolved()
    models = load_models(config)
    hooks = install_hooks(models)
    try:
        runners, notes = build_runners(config, models, hooks)
    finally:
        hooks.remove()
    plain = next(r for r in runners if r.name == "llamacpp")
    ours = next(r for r in runners if r.name == "llamacpp:ours_autoregressive")
    assert plain.settings["gguf"] == "q8_0" and ours.settings["gguf"].endswith("-q8_0.gguf"), notes
    prompt = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99]])
    plain.eos_token_id = ours.eos_token_id = None
    assert ours.run(prompt, 0.0, 0, 16).new_ids == plain.run(prompt, 0.0, 0, 16).new_ids
