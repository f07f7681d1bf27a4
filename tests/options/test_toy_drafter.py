"""A drafter with its own weights file, written here: its options class, its drafter class and one registry line
(register_options) give it flags in `generate`, `serve` and `bench`, a keyword of load(), its file from a zoo
entry and the zoo's missing-file message, with no edit anywhere else in the package (issue #20)."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.api import load
from draftverify.cli import app
from draftverify.drafters.base import Drafter, empty_draft
from draftverify.methods import METHODS, Method
from draftverify.options import option, register_options
from draftverify.registry import DRAFTER_OPTIONS, DRAFTERS
from draftverify.zoo import ZOO_ENV

runner = CliRunner()


@dataclass(frozen=True)
class ToyOptions:
    toy_path: Path | None = option(None, "--toy", "The toy drafter's weights file.", zoo="toy.json",
                                   what="toy weights")
    toy_scale: float = option(0.5, "--toy-scale", "How far the toy trusts itself.")


class ToyDrafter(Drafter):
    """Reads its weights file and drafts nothing (so its text is the target's own)."""

    built: list[tuple[Path, float, dict]] = []

    @classmethod
    def from_options(cls, target, options) -> "ToyDrafter":
        if options.toy_path is None:
            raise DraftVerifyError("the toy drafter needs its weights: pass --toy FILE")
        cls.built.append((Path(options.toy_path), options.toy_scale, json.loads(Path(options.toy_path).read_text())))
        return cls()

    def propose(self, state, gamma: int):
        return empty_draft(state)


@pytest.fixture
def toy(monkeypatch):
    """The toy's registration, undone after the test: its class, its method, and the one options line."""
    monkeypatch.setitem(DRAFTERS, "toy", ToyDrafter)
    monkeypatch.setitem(METHODS, "toy", Method("toy", "exact", "a toy drafter with a weights file"))
    register_options("toy", ToyOptions)
    ToyDrafter.built.clear()
    yield
    DRAFTER_OPTIONS.pop("toy")


@pytest.fixture
def toy_zoo(tmp_path, monkeypatch, model_dirs):  # noqa: F811
    """A zoo with an entry that ships the toy's file and one that does not."""
    for entry in ("toyzoo", "plain"):
        shutil.copytree(model_dirs / "target", tmp_path / entry / "target")
    (tmp_path / "toyzoo" / "toy.json").write_text('{"weights": [1, 2]}')
    monkeypatch.setenv(ZOO_ENV, str(tmp_path))
    return tmp_path


def test_the_toy_gets_its_flags_in_every_command(toy):
    for command in ("generate", "serve", "bench"):
        text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"}).stdout
        assert "--toy " in text and "--toy-scale" in text and "Methods: toy." in text, command
        assert "The toy drafter's weights file." in text and "[default: 0.5]" in text


def test_the_toy_is_not_there_without_its_registry_line():
    text = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"}).stdout
    assert "--toy" not in text and "toy" not in DRAFTER_OPTIONS


def test_the_zoo_fills_the_toys_file_for_the_cli_and_load(toy, toy_zoo, model_dirs):  # noqa: F811
    result = runner.invoke(app, ["generate", "--zoo", "toyzoo", "--method", "toy", "--toy-scale", "0.25",
                                 "--prompt", PROMPT, "-n", "6", "--json", "--no-heal"])
    assert result.exit_code == 0, result.output
    assert ToyDrafter.built == [(toy_zoo / "toyzoo" / "toy.json", 0.25, {"weights": [1, 2]})]
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
    assert result.stderr.strip() == ("error: the 'plain' zoo ships no toy weights for toy: only the toyzoo zoo ships "
                                     "one; pass --toy PATH (API: toy_path=PATH), or use another method")
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
