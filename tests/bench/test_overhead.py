"""`draftverify bench overhead`: the loop's own share of wall time, from each generation's timers."""

from __future__ import annotations

import json
import os

import pytest
from bench_fixtures import model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.backends.gguf import converter_available, default_build_dir, tools_built
from draftverify.bench import llamacpp
from draftverify.bench.overhead_llamacpp import BARE, DEFAULT_BUILD_ROW, SERVER_ROW
from draftverify.cli import app


def test_bench_overhead_reports_each_methods_shares(model_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "overhead",
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--methods",
        "autoregressive,model",
        "-n",
        "6",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in json.loads((tmp_path / "loop-overhead.json").read_text())["rows"]}
    assert list(rows) == ["autoregressive", "model"]
    plain, drafted = rows["autoregressive"], rows["model"]
    assert plain["new_tokens"] == drafted["new_tokens"] == 6 and plain["target_calls"] == 6
    assert drafted["draft"] > plain["draft"] and drafted["target_calls"] < 6  # the draft model costs time, saves calls
    for row in rows.values():
        assert 0 < row["overhead"] < 100 and abs(row["overhead"] - row["verify"] - row["other"]) < 1e-6
    assert "| model | 6 |" in (tmp_path / "loop-overhead.md").read_text()


def test_the_bench_commands_refuse_a_thread_count_below_one():
    for command in ("overhead", "rounds", "cold-start", "ab"):
        args = ["bench", command, "--threads", "0"] + (["--vary", "gamma=2,4"] if command == "ab" else [])
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (command, result.output)
        assert "--threads" in result.output


def test_the_bench_commands_refuse_no_prompts_and_no_tokens():
    for command, extra in (("samples", []), ("rounds", []), ("ab", ["--vary", "gamma=2,4"])):
        for flag in ("--num-prompts", "--max-new-tokens"):
            result = CliRunner().invoke(app, ["bench", command, flag, "0", *extra])
            assert result.exit_code == 2, (command, flag, result.output)
            assert flag in result.output


needs_llama_cpp = pytest.mark.skipif(
    not (llamacpp.installed() and converter_available()),
    reason="llama-cpp-python not installed or no llama.cpp converter (scripts/fetch_llama_cpp_converter.sh)",
)


@needs_llama_cpp
def test_on_llamacpp_it_splits_each_runners_time_at_llama_decode_beside_a_bare_loop(model_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "overhead",
        "--backend",
        "llamacpp",
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--methods",
        "autoregressive,prompt_lookup,model",
        "--num-prompts",
        "2",
        "--rounds",
        "1",
        "--gamma",
        "conf",
        "-n",
        "12",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    result = json.loads((tmp_path / "loop-overhead-llamacpp.json").read_text())
    rows = {r["runner"]: r for r in result["rows"]}
    server = rows.pop(SERVER_ROW, None)
    default_build = rows.pop(DEFAULT_BUILD_ROW, None)
    assert list(rows) == [BARE, "autoregressive", "prompt_lookup", "model"]
    assert (
        result["gamma"] == "conf"
        and "greedy, draft length conf," in (tmp_path / "loop-overhead-llamacpp.md").read_text()
    )
    bare, plain = rows[BARE], rows["autoregressive"]
    text = (tmp_path / "loop-overhead-llamacpp.md").read_text()
    if tools_built():  # llama.cpp's own llama-server on the same file: the same greedy tokens, its own time
        assert server is not None and server["same_tokens"] and server["new_tokens"] == bare["new_tokens"]
        assert server["decode_s"] is None and server["wall_s"] > 0
        assert result["server"]["bare_vs_server"] == pytest.approx(bare["tok_s"] / server["tok_s"])
        assert result["server"]["autoregressive_vs_server"] == pytest.approx(plain["tok_s"] / server["tok_s"])
        assert f"| {SERVER_ROW} | {server['new_tokens']} |" in text and "the bare loop at **" in text
    else:
        assert server is None and result["server"] is None and f"No {SERVER_ROW} row:" in text
    if default_build_dir() is not None:  # llama.cpp's default (shared-library) build of the same server beside it
        assert default_build["same_tokens"] and default_build["new_tokens"] == bare["new_tokens"]
        assert default_build["decode_s"] is None
        summary = result["server_default_build"]
        assert summary["bare_vs_server"] == pytest.approx(bare["tok_s"] / default_build["tok_s"])
        assert summary["static_vs_default"] == pytest.approx(server["tok_s"] / default_build["tok_s"])
        assert f"| {DEFAULT_BUILD_ROW} | {default_build['new_tokens']} |" in text
        assert f"the static build decodes at **{summary['static_vs_default']:.3f}x**" in text
    else:
        assert default_build is None and result["server_default_build"] is None
        assert tools_built() == (f"No {DEFAULT_BUILD_ROW} row:" in text)
    library = result["llama_cpp_library"]  # the one LLAMA_CPP_LIB_PATH names, else llama-cpp-python's own
    assert library["path"] == (os.environ.get("LLAMA_CPP_LIB_PATH") or None)
    named = f"LLAMA_CPP_LIB_PATH={library['path']}" if library["path"] else "llama-cpp-python's own build"
    assert f"The Python rows' llama.cpp library: {named}; llamafile's matrix kernels" in text.replace("`", "")
    assert bare["vs_bare"] == 1.0 and bare["steps"] == bare["new_tokens"]
    assert plain["new_tokens"] == bare["new_tokens"] and plain["steps"] == plain["new_tokens"]
    for row in rows.values():
        assert row["same_tokens"], row["runner"]  # every runner here is lossless: the bare loop's tokens
        assert 0 < row["decode_s"] < row["wall_s"]
        assert row["outside_ms_per_token"] == pytest.approx(
            1000 * (row["wall_s"] - row["decode_s"]) / row["new_tokens"]
        )
    assert rows["model"]["steps"] < rows["model"]["new_tokens"]  # its drafts are kept, some at least
    assert "| model |" in (tmp_path / "loop-overhead-llamacpp.md").read_text()


def test_bench_overhead_refuses_an_unknown_backend_and_a_gguf_type_on_hf():
    result = CliRunner().invoke(app, ["bench", "overhead", "--backend", "onnx"])
    assert result.exit_code == 2 and "--backend" in result.output and "onnx" in result.output
    result = CliRunner().invoke(app, ["bench", "overhead", "--target-gguf", "q8_0"])
    assert result.exit_code == 2 and "--target-gguf" in result.output
    result = CliRunner().invoke(app, ["bench", "overhead", "--gamma", "conf"])
    assert result.exit_code == 2 and "--gamma" in result.output and "llamacpp only" in result.output
    result = CliRunner().invoke(app, ["bench", "overhead", "--backend", "llamacpp", "--gamma", "fast"])
    assert result.exit_code == 2 and "--gamma" in result.output and "'fast'" in result.output
