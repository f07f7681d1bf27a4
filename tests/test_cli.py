"""The command line: generate streams text and prints the statistics table; errors exit 2 with a message."""
from __future__ import annotations

import json

from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)
from typer.testing import CliRunner

from draftverify.cli import app

runner = CliRunner()


def test_generate_streams_text_and_prints_stats(model_dirs):  # noqa: F811
    result = runner.invoke(app, ["generate", "--target", str(model_dirs / "target"), "--draft",
                                 str(model_dirs / "draft"), "--method", "model", "--prompt", PROMPT, "-n", "16"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(PROMPT)
    for measure in ("target calls", "mean tokens per target call", "acceptance rate alpha", "time: draft",
                    "time: target forward", "loop overhead", "tokens / s"):
        assert measure in result.output


def test_generate_json_matches_the_python_api(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(app, ["generate", "--target", str(model_dirs / "target"), "--method", "prompt_lookup",
                                 "--prompt", PROMPT, "-n", "16", "--gamma", "auto", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=16)
    assert payload["text"] == expected.text
    assert payload["stats"]["new_tokens"] == 16


def test_bad_inputs_exit_2_with_a_message(model_dirs):  # noqa: F811
    target = str(model_dirs / "target")
    cases = [
        (["--method", "nope"], "unknown method"),
        (["--method", "bild", "--alpha-fb", "1.5"], "alpha_FB"),
        (["--method", "autoregressive", "--gamma", "0"], "gamma"),
        (["--method", "autoregressive", "--temperature", "-1"], "temperature"),
        (["--method", "model_tree", "--tree-paths", "[[0], [0, 0, 0]]"], "no parent path"),
        (["--method", "model_tree", "--tree-paths", "[0, 1]"], "--tree-paths"),
    ]
    for extra, message in cases:
        args = ["generate", "--target", target, "--draft", str(model_dirs / "draft"), "--prompt", PROMPT] + extra
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output, (extra, result.output)
        assert "Traceback" not in result.output


def test_methods_lists_every_method():
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    for name in ("autoregressive", "model", "prompt_lookup", "ngram", "early_exit", "bild", "specdec++", "model_tree",
                 "prompt_lookup_tree"):
        assert name in result.output


def test_generate_with_a_tree_method_and_a_custom_shape(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(app, ["generate", "--target", str(model_dirs / "target"), "--draft", str(model_dirs / "draft"),
                                 "--method", "model_tree", "--tree-paths", "[[0], [1], [0, 0]]", "--prompt", PROMPT,
                                 "-n", "12", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=12)
    assert payload["text"] == expected.text
    calls, drafted = payload["stats"]["target_calls"], payload["stats"]["drafted_tokens"]
    assert 3 * (calls - 1) <= drafted <= 3 * calls  # the 3-node shape (only the last step may be cut to depth 1)


def test_generate_compiled_gives_the_same_text(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(app, ["generate", "--target", str(model_dirs / "target"), "--method", "prompt_lookup",
                                 "--compile", "--prompt", PROMPT, "-n", "8", "--gamma", "3", "--json"])
    assert result.exit_code == 0, result.output
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=8)
    assert json.loads(result.output)["text"] == expected.text
