"""The suffix method through load() and the CLI: one cache per pipeline, bad option values refused in one line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from draftverify.api import load
from draftverify.cli import app
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)

runner = CliRunner()


def test_one_pipeline_keeps_its_cache_across_generate_calls(model_dirs):  # noqa: F811
    pipe = load(target=model_dirs / "target", method="suffix", gamma=6, suffix_min_prob=0.2)
    first = pipe.generate(PROMPT, max_new_tokens=24)
    second = pipe.generate(PROMPT, max_new_tokens=24)
    plain = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=24)
    assert first.text == second.text == plain.text
    assert second.stats.target_calls < first.stats.target_calls
    assert pipe.drafter.min_prob == 0.2
    # another pipeline starts with an empty cache
    assert load(target=model_dirs / "target", method="suffix", gamma=6).drafter.index.tokens == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--suffix-min-prob", "1.5"], "--suffix-min-prob"),
        (["--suffix-cache-tokens", "0"], "--suffix-cache-tokens"),
        (["--suffix-min-match", "4", "--suffix-max-match", "2"], "--suffix-min-match"),
        (["--suffix-max-match", "0"], "got 1 and 0"),  # the default shortest match is not lowered past 1
    ],
)
def test_bad_values_exit_2_with_one_line(model_dirs, extra, message):  # noqa: F811
    args = ["generate", "--target", str(model_dirs / "target"), "--prompt", PROMPT, "-n", "4", "--method", "suffix"]
    result = runner.invoke(app, args + extra)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
