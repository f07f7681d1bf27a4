"""The declarations (options/): MethodOptions is their union with one default each, the zoo fills the declared
files, names and flags are unique, every registered drafter exists, and none of it imports torch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from draftverify import DraftVerifyError
from draftverify.api import load
from draftverify.methods import MethodOptions
from draftverify.options import all_fields, check_files, declare, defaults, fill_from_zoo, option, zoo_files
from draftverify.options.checks import check_zoo_ships, methods_reading, unused_flags
from draftverify.registry import DRAFTER_OPTIONS, DRAFTERS


def declared_names() -> dict[str, object]:
    """Every field with a flag, and its declared default."""
    return {name: declare.default_of(f) for name, (_, f) in all_fields().items() if declare.declaration(f)}


def test_method_options_is_the_union_with_the_declared_defaults():
    options = MethodOptions()
    for name, default in defaults().items():
        assert getattr(options, name) == default, name
    assert {
        "nat_path",
        "ngram_path",
        "heads_path",
        "bita_path",
        "bita_topk",
        "tree_paths",
        "early_exit_layers",
        "alpha_fb",
        "tau",
        "draft_model",
        "compile",
    } <= set(defaults())
    changed = options.replace(bita_topk=5, nat_path="x")
    assert (changed.bita_topk, changed.nat_path, options.bita_topk) == (5, "x", 3)
    assert changed != options and options.replace() == options


def test_unknown_names_are_one_clear_error_naming_the_known_ones():
    with pytest.raises(DraftVerifyError, match=r"unknown option\(s\) nat_dir; the options are: .*nat_path"):
        MethodOptions(nat_dir="x")
    with pytest.raises(DraftVerifyError, match="unknown option"):
        MethodOptions().nat_dir = "x"


def test_load_takes_every_declared_option_by_name(tmp_path):
    """Every declared name gets past load()'s option checks: the error is the (empty) target folder's."""
    with pytest.raises(DraftVerifyError, match="has no tokenizer files"):
        load(target=tmp_path, method="autoregressive", **declared_names())
    with pytest.raises(DraftVerifyError, match="unknown option"):
        load(target=tmp_path, method="autoregressive", nat_dir="x")


def test_the_zoo_fills_the_declared_files_that_it_has_and_were_not_given(tmp_path):
    (tmp_path / "ngram.safetensors").write_bytes(b"")
    (tmp_path / "nat").mkdir()
    files = zoo_files(tmp_path)
    assert files["ngram_path"] == tmp_path / "ngram.safetensors" and files["heads_path"] == tmp_path / "heads"
    filled = fill_from_zoo({"nat_path": Path("mine"), "bita_topk": 2}, tmp_path)
    assert filled == {"nat_path": Path("mine"), "bita_topk": 2, "ngram_path": tmp_path / "ngram.safetensors"}


def test_a_declared_file_given_that_is_not_there_is_named_before_loading(tmp_path):
    with pytest.raises(
        DraftVerifyError, match=r"^--heads .*nowhere: no such file or directory \(API: heads_path=\.\.\.\)$"
    ):
        check_files({"heads_path": tmp_path / "nowhere"})
    check_files({"heads_path": tmp_path, "bita_topk": 7})  # there, and not a file option


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_declared_path_is_named_not_read_as_the_current_folder(empty):
    with pytest.raises(
        DraftVerifyError, match=r"^--eagle3 is empty: give a file or folder path \(API: eagle3_path=\.\.\.\)$"
    ):
        check_files({"eagle3_path": empty})


def test_a_zoo_without_a_file_the_method_needs_says_which_entry_ships_one():
    with pytest.raises(DraftVerifyError) as caught:
        check_zoo_ships("translate", "bpd_pbest", {})
    message = str(caught.value)
    assert message.startswith(
        "the 'translate' zoo ships no blockwise heads for bpd / bpd_ngram / bpd_neural / bpd_pbest"
    )
    assert "only the code zoo ships one; pass --heads PATH (API: heads_path=PATH)" in message
    check_zoo_ships("translate", "bpd_pbest", {"heads_path": "given", "ngram_path": "given"})
    check_zoo_ships("code", "bpd_pbest", {})  # the code zoo ships heads and an n-gram table


def test_options_a_method_does_not_read_are_named():
    notes = unused_flags("model", {"nat_path": "x", "bita_topk": 3, "alpha_fb": 0.5})
    assert notes == ["--nat is used by specdec, specdec++_nat, not 'model'; ignored"]  # bita_topk: its default
    assert unused_flags("bpd_ngram", {"ngram_path": "t", "lattice_k": 2}) == []
    assert methods_reading("pbest") == ["bpd_pbest"]


def test_every_registered_drafter_exists_and_reads_declared_fields():
    from draftverify import drafters  # noqa: F401  (fills the drafter registry)

    assert set(DRAFTER_OPTIONS) <= set(DRAFTERS)
    for drafter, classes in DRAFTER_OPTIONS.items():
        assert classes and all(declare.declared(c) for c in classes), drafter


def test_two_declarations_of_one_flag_are_refused(monkeypatch):
    @dataclass(frozen=True)
    class Clash:
        other_nat: Path | None = option(None, "--nat", "Another NAT folder.")

    monkeypatch.setitem(DRAFTER_OPTIONS, "clash", (Clash,))
    with pytest.raises(RuntimeError, match="flag --nat declared for both 'nat_path' and 'other_nat'"):
        all_fields()


def test_a_zoo_file_must_say_what_it_is():
    with pytest.raises(TypeError, match="names what it is"):
        option(None, "--x", "x", zoo="x.bin")


def test_the_declarations_import_no_torch():
    code = (
        "import sys, draftverify.options, draftverify.options.checks, draftverify.cli_flags;"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False False", out.stderr
