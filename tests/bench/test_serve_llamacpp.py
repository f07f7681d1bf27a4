"""`draftverify bench serve-llamacpp`: bad options exit 2 with one line before any server starts, the report's
tables are computed from the cells, and on the zoo's target both servers answer and their single-request texts
agree (skipped, with the reason, without llama.cpp's tools or the llamacpp extra)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from typer.testing import CliRunner

from draftverify.backends.gguf import converter_available, tools_built
from draftverify.bench.serve_llamacpp import markdown, parse_list, scaling, server_specs, versus
from draftverify.cli import app
from draftverify.errors import DraftVerifyError


@pytest.mark.parametrize(
    "args, message",
    [
        (["--clients", "1,x"], "--clients takes a comma list of integers"),
        (["--clients", "0,4"], "--clients: every value must be in 1..64"),
        (["--max-tokens", "0"], "--max-tokens: every value must be in 1..4096"),
        (["--per-client", "0"], "--per-client must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--gamma", "fast"], "gamma"),
        (["--target-gguf", "q3"], "target's GGUF type"),
        (["--native", "ngram-what"], "unknown type 'ngram-what'"),
        (["--native", "draft-eagle3"], "draft-eagle3 is not offered here"),
        (["--methods", "nonsense"], "nonsense"),
        (["--methods", ""], "names no method of ours"),
        (["--rounds", "0"], "--rounds must be in 1..20"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, message):
    result = CliRunner().invoke(app, ["bench", "serve-llamacpp", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) <= 2


def test_lists_and_servers_parse():
    assert parse_list("1, 4,8", "--clients") == [1, 4, 8]
    with pytest.raises(DraftVerifyError):
        parse_list("", "--clients")
    specs = server_specs("autoregressive,model", ["plain", "ngram-mod", "llamacpp_native[draft-simple,n_max=8]"])
    assert [s.name for s in specs] == [
        "ours:autoregressive",
        "ours:model",
        "llamacpp_native[plain]",
        "llamacpp_native[ngram-mod]",
        "llamacpp_native[draft-simple,n_max=8]",
    ]
    ours = server_specs("model,model[16],model[conf=0.4]", [])[:3]
    assert [(s.name, s.method, s.gamma) for s in ours] == [
        ("ours:model", "model", None),
        ("ours:model[16]", "model", "16"),
        ("ours:model[conf=0.4]", "model", "conf=0.4"),
    ]
    for bad, why in (
        ("model[", "METHOD\\[GAMMA\\]"),
        ("model[0]", "gamma"),
        ("model[conf=2]", "conf"),
        ("nope", "unknown method .nope."),
    ):
        with pytest.raises(DraftVerifyError, match=why):
            server_specs(bad, [])


def _cell(server, clients, rate, alone, rounds=None):
    return {
        "server": server,
        "max_tokens": 32,
        "clients": clients,
        "tokens_per_second": rate,
        "rounds_tokens_per_second": rounds or [rate],
        "requests_per_second": 1.0,
        "latency_p50_s": 0.1,
        "latency_p99_s": 0.2,
        "errors": {},
        "greedy_equal_single": f"{clients}/{clients}",
        "alone": alone,
    }


def test_scaling_and_versus_come_from_the_cells():
    same, other = {"a": "x", "b": "y"}, {"a": "x", "b": "z"}
    cells = [
        _cell("ours:model", 1, 100.0, same),
        _cell("llamacpp_native[plain]", 1, 80.0, same),
        _cell("ours:model", 8, 300.0, other, [300.0, 330.0, 200.0]),
        _cell("llamacpp_native[plain]", 8, 400.0, same, [400.0, 300.0, 250.0]),
    ]
    assert [(s["server"], s["clients"], s["ratio"]) for s in scaling(cells)] == [
        ("ours:model", 1, 1.0),
        ("llamacpp_native[plain]", 1, 1.0),
        ("ours:model", 8, 3.0),
        ("llamacpp_native[plain]", 8, 5.0),
    ]
    rows = versus(cells)
    assert [(r["clients"], r["ratio"], r["alone_equal_native_plain"]) for r in rows] == [
        (1, 1.25, "2/2"),
        (8, 0.75, "1/2"),
    ]
    report = {
        "command": "draftverify bench serve-llamacpp",
        "target_gguf": "t.gguf",
        "draft_gguf": None,
        "threads": 2,
        "gamma": "4",
        "per_client": 1,
        "prompts": 2,
        "cells": cells,
        "scaling": scaling(cells),
        "versus": rows,
    }
    # round by round: the same round's loads paired, whatever the medians of each side were
    assert [(r["paired_ratios"], r["paired_median"], r["rounds_ahead"]) for r in rows] == [
        ([1.25], 1.25, "1/1"),
        ([0.75, 1.1, 0.8], 0.8, "1/3"),
    ]
    text = markdown(report)
    assert (
        "| 32 | 8 | `ours:model` | 300.0 | `llamacpp_native[plain]` | 400.0 | 0.75x | 0.75x / 1.1x / 0.8x | 0.8x | 1/3 "
        "| 1/2 |" in text
    )
    assert "| 32 | `llamacpp_native[plain]` | 8 | 1 | 5.0x |" in text


@pytest.mark.skipif(
    not (tools_built() and importlib.util.find_spec("llama_cpp") and converter_available()),
    reason="llama.cpp's tools are not built (scripts/build_llama_cpp_tools.sh) or the llamacpp extra is absent",
)
def test_both_servers_answer_every_request_on_the_zoo(tmp_path, tmp_path_factory, monkeypatch):
    if not os.environ.get("DRAFTVERIFY_GGUF_CACHE"):
        monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path_factory.mktemp("serve-gguf")))
    out = tmp_path / "load.json"
    args = [
        "--clients",
        "1,2",
        "--max-tokens",
        "8",
        "--per-client",
        "1",
        "--methods",
        "autoregressive",
        "--rounds",
        "2",
    ]
    result = CliRunner().invoke(app, ["bench", "serve-llamacpp", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [(c["server"], c["clients"]) for c in report["cells"]] == [
        ("ours:autoregressive", 1),
        ("llamacpp_native[plain]", 1),
        ("ours:autoregressive", 2),
        ("llamacpp_native[plain]", 2),
    ]
    for cell in report["cells"]:
        assert cell["ok"] == cell["requests"] == cell["clients"] and cell["tokens"] > 0  # the median round's
        assert (
            len(cell["rounds_tokens_per_second"]) == 2 and cell["tokens_per_second"] in cell["rounds_tokens_per_second"]
        )
        assert cell["greedy_equal_single"] == f"{2 * cell['clients']}/{2 * cell['clients']}"  # every round's answers
    # greedy on the same f32 file: our plain decoding says what llama-server's says
    assert all(row["alone_equal_native_plain"] == "6/6" for row in report["versus"])
    assert out.with_suffix(".md").exists()
