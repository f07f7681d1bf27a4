"""`draftverify bench-overhead`: the loop's own share of wall time, from each generation's timers."""

from __future__ import annotations

import json

from bench_fixtures import model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.cli import app


def test_bench_overhead_reports_each_methods_shares(model_dir, tmp_path):  # noqa: F811
    args = [
        "bench-overhead",
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
    for command in ("bench-overhead", "bench-rounds", "bench-cold-start", "bench-ab"):
        args = [command, "--threads", "0"] + (["--vary", "gamma=2,4"] if command == "bench-ab" else [])
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (command, result.output)
        assert "--threads" in result.output


def test_the_bench_commands_refuse_no_prompts_and_no_tokens():
    for command, extra in (("bench-samples", []), ("bench-rounds", []), ("bench-ab", ["--vary", "gamma=2,4"])):
        for flag in ("--num-prompts", "--max-new-tokens"):
            result = CliRunner().invoke(app, [command, flag, "0", *extra])
            assert result.exit_code == 2, (command, flag, result.output)
            assert flag in result.output
