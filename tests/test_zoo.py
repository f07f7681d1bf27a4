"""Where the shipped models are found: a checkout, $DRAFTVERIFY_ZOO, or the user's data folder after `pip install .`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from draftverify import zoo
from draftverify.cli import app
from draftverify.errors import DraftVerifyError


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """The package as a normal install sees it: no zoo/ beside the sources, no $DRAFTVERIFY_ZOO."""
    monkeypatch.setattr(zoo, "source_tree_zoo", lambda: tmp_path / "site-packages" / "zoo")
    monkeypatch.delenv(zoo.ZOO_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def test_a_checkout_finds_the_repository_zoo(monkeypatch):
    monkeypatch.delenv(zoo.ZOO_ENV, raising=False)
    assert zoo.zoo_root() == zoo.source_tree_zoo()
    assert (zoo.zoo_folder("code") / "target" / "config.json").is_file()


def test_the_environment_variable_wins(monkeypatch, tmp_path):
    (tmp_path / "mine" / "code").mkdir(parents=True)
    monkeypatch.setenv(zoo.ZOO_ENV, str(tmp_path / "mine"))
    assert zoo.zoo_folder("code") == tmp_path / "mine" / "code"


def test_an_install_looks_in_the_user_data_folder(installed):
    assert zoo.zoo_root() == installed / "data" / "draftverify" / "zoo"
    (zoo.zoo_root() / "code").mkdir(parents=True)
    assert zoo.zoo_folder("code") == installed / "data" / "draftverify" / "zoo" / "code"


def test_no_zoo_names_the_variable_and_the_folder(installed):
    with pytest.raises(
        DraftVerifyError, match=r"no zoo folder at .*data/draftverify/zoo: copy .* or set \$DRAFTVERIFY_ZOO"
    ):
        zoo.zoo_folder("code")


def test_a_wrong_environment_variable_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(zoo.ZOO_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DraftVerifyError, match=r"\$DRAFTVERIFY_ZOO=.*nowhere is not a zoo folder"):
        zoo.zoo_folder("code")


def test_a_missing_entry_lists_the_available_ones(installed):
    (zoo.zoo_root() / "translate").mkdir(parents=True)
    with pytest.raises(DraftVerifyError, match="no zoo entry 'code' under .*; available: translate"):
        zoo.zoo_folder("code")


def test_cli_without_a_zoo_exits_2_with_one_line(installed):
    result = CliRunner().invoke(app, ["generate", "--zoo", "code", "--prompt", "def f(x):", "-n", "4"])
    assert result.exit_code == 2, result.output
    assert "DRAFTVERIFY_ZOO" in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""
