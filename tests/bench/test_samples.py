"""`draftverify bench samples`: the target's greedy completions, cut at HumanEval's stop sequences."""

from __future__ import annotations

from bench_fixtures import data_dir, model_dir  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from draftverify.api import load
from draftverify.bench.prompts import load_prompts, truncate_at_stops
from draftverify.cli import app


def test_bench_samples_writes_the_targets_own_completions(model_dir, data_dir, tmp_path):  # noqa: F811
    args = [
        "bench",
        "samples",
        "--target",
        str(model_dir / "target"),
        "--num-prompts",
        "2",
        "-n",
        "10",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "humaneval-samples.md").read_text()
    pipe = load(target=model_dir / "target", method="autoregressive")
    for prompt in load_prompts("humaneval", data_dir)[:2]:  # as the bench runs them (trimmed)
        completion = pipe.generate(prompt.text, max_new_tokens=10).text
        cut = truncate_at_stops(completion, prompt.stops)
        ending = "ends on its own" if len(cut) < len(completion) else "runs to the token limit"
        assert f"## {prompt.id} ({ending})\n\n```python\n{prompt.text}{cut.rstrip()}\n```" in text
    assert "HumanEval/2" not in text
