"""A method with its own weights file, declared in one file (toy_method.py: its options class, its drafter class and
one register_methods call) and registered by one line (here the plug-in entry point that names it): it gets flags
in `generate`, `serve` and `bench`, a line in `draftverify methods`, a keyword of load(), its file from a zoo entry
and the zoo's missing-file message, and a place in registered_methods(), with no edit anywhere in the package."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys

import pytest
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.api import load
from draftverify.cli import app
from draftverify.methods import METHODS, registered_methods
from draftverify.registry import DRAFTER_OPTIONS, DRAFTERS, PLUGIN_GROUP, load_plugins, unregister_methods
from draftverify.zoo import ZOO_ENV
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)

runner = CliRunner()


@pytest.fixture
def toy(monkeypatch):
    """The toy registered as a plug-in is: one entry point naming its module, loaded by load_plugins(); undone after
    the test. Returns its drafter class."""
    point = importlib.metadata.EntryPoint("toy", "toy_method", PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [point] if group == PLUGIN_GROUP else [])
    sys.modules.pop("toy_method", None)
    load_plugins()
    drafter = sys.modules["toy_method"].ToyDrafter
    drafter.built.clear()
    yield drafter
    unregister_methods("toy")
    sys.modules.pop("toy_method", None)


def test_the_toy_is_a_registered_method_with_its_declaration(toy):
    spec = next(m for m in registered_methods() if m.name == "toy")
    assert (spec.drafter, spec.verifier, spec.lossless, spec.batches, spec.needs_draft) == (
        "toy",
        "exact",
        True,
        True,
        False,
    )
    assert spec.drafter_class() is toy and spec.needs_target_modules == ""
    text = runner.invoke(app, ["methods"], env={"COLUMNS": "400"}).stdout
    assert "a toy drafter with a weights file" in text


@pytest.fixture
def toy_zoo(tmp_path, monkeypatch, model_dirs):  # noqa: F811
    """A zoo with an entry that ships the toy's file and one that does not."""
    for entry in ("toyzoo", "plain"):
        shutil.copytree(model_dirs / "target", tmp_path / entry / "target")
    (tmp_path / "toyzoo" / "toy.json").write_text('{"weights": [1, 2]}')
    monkeypatch.setenv(ZOO_ENV, str(tmp_path))
    return tmp_path


def test_the_toy_gets_its_flags_in_every_command(toy):
    for command in (["generate"], ["serve"], ["bench", "speed"]):
        text = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"}).stdout
        assert "--toy " in text and "--toy-scale" in text and "Methods: toy." in text, command
        assert "The toy drafter's weights file." in text and "[default: 0.5]" in text


def test_the_toy_is_not_there_without_its_registration_line():
    text = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"}).stdout
    assert "--toy" not in text and "toy" not in DRAFTER_OPTIONS and "toy" not in METHODS and "toy" not in DRAFTERS


def test_the_zoo_fills_the_toys_file_for_the_cli_and_load(toy, toy_zoo, model_dirs):  # noqa: F811
    result = runner.invoke(
        app,
        [
            "generate",
            "--zoo",
            "toyzoo",
            "--method",
            "toy",
            "--toy-scale",
            "0.25",
            "--prompt",
            PROMPT,
            "-n",
            "6",
            "--json",
            "--no-heal",
        ],
    )
    assert result.exit_code == 0, result.output
    assert toy.built == [(toy_zoo / "toyzoo" / "toy.json", 0.25, {"weights": [1, 2]})]
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=6)
    assert json.loads(result.stdout)["text"] == expected.text
    pipe = load(zoo="toyzoo", method="toy")
    assert pipe.options.toy_path == toy_zoo / "toyzoo" / "toy.json" and pipe.options.toy_scale == 0.5
    mine = toy_zoo / "mine.json"
    mine.write_text("{}")
    assert load(zoo="toyzoo", method="toy", toy_path=mine).options.toy_path == mine  # given wins over the zoo's


def test_a_zoo_without_the_toys_file_says_so_before_loading(toy, toy_zoo):
    result = runner.invoke(app, ["generate", "--zoo", "plain", "--method", "toy", "--prompt", "x"])
    assert result.exit_code == 2 and "loading" not in result.stderr
    assert result.stderr.strip() == (
        "error: the 'plain' zoo ships no toy weights for toy: only the toyzoo zoo ships "
        "one; pass --toy PATH (API: toy_path=PATH), or use another method"
    )
    with pytest.raises(DraftVerifyError, match="the 'plain' zoo ships no toy weights for toy"):
        load(zoo="plain", method="toy")
    served = runner.invoke(app, ["serve", "--zoo", "plain", "--method", "toy"])
    assert served.exit_code == 2 and "ships no toy weights" in served.stderr


def test_the_bench_gives_the_toy_its_file(toy, toy_zoo):
    from draftverify.bench.config import BenchConfig
    from draftverify.bench.models import method_options

    values, notes = method_options(BenchConfig(zoo="toyzoo", options={"toy_scale": 0.75}).resolved())
    assert values["toy_path"] == toy_zoo / "toyzoo" / "toy.json" and values["toy_scale"] == 0.75
    assert not any("toy" in note for note in notes)
    _, notes = method_options(BenchConfig(zoo="plain").resolved())
    assert "no toy weights (pass --toy or a zoo that has one): skipped toy" in notes
