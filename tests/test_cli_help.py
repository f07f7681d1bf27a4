"""Every command's and subcommand's --help, rendered as a user sees it on a wide terminal, tells the truth: no text in
square brackets eaten as rich markup, every method list agrees with the registry (which methods batch, which take
a draft, the runner families), and every declared option shows its declared default."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from draftverify.bench.runner_families import BASELINES, PEER_FAMILIES, drafting_methods
from draftverify.cli import app
from draftverify.methods import METHODS
from draftverify.options import SharedOptions, all_fields
from draftverify.options.declare import declaration, default_of
from draftverify.zoo import trained_exit_layers

runner = CliRunner()
BRACKETED = re.compile(r"\S*\[[^\]\s]*\]\S*")  # a word holding [...]: .[llamacpp], draftverify[ray], METHOD[auto]


def commands(group: click.Command, path: tuple[str, ...] = ()):
    """(path, click command) for the app and every command and subcommand under it."""
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


def rendered(path: tuple[str, ...]) -> str:
    """The --help of one command, wide, with rich's box lines and wrapping folded into single spaces."""
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, (path, result.output)
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.stdout).split())


def listed(text: str, before: str, after: str) -> set[str]:
    """The comma list between `before` and `after` in text."""
    match = re.search(re.escape(before) + r"(.*?)" + re.escape(after), text)
    assert match, (before, text[:200])
    return {name.strip() for name in match.group(1).split(",")}


def methods_where(test) -> set[str]:
    return {name for name, m in METHODS.items() if test(m)}


def test_every_command_has_a_help():
    assert {" ".join(p) for p, _ in ALL} >= {
        "generate",
        "serve",
        "bench",
        "bench speed",
        "bench batch",
        "reproduce",
        "reproduce specdec",
        "methods",
        "train",
        "train lm",
        "train nat",
    }
    for path, _ in ALL:
        rendered(path)


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(p) or "draftverify")
def test_no_text_in_square_brackets_is_eaten(path):
    text = rendered(path)
    command = dict(ALL)[path]
    helps = [command.help or ""] + [p.help or "" for p in getattr(command, "params", [])]
    for help_text in helps:
        for word in BRACKETED.findall(help_text.replace("\\[", "[")):
            assert word.strip(".,;:()'\"") in text or word in text, (path, word)


def test_the_install_hints_and_length_syntax_survive():
    assert 'pip install -e ".[llamacpp]"' in rendered(("generate",))
    assert "pip install 'draftverify[ray]'" in rendered(("serve",))
    assert "METHOD[auto]" in rendered(("bench", "batch")) and "'lookup_model,lookup_model[auto]'" in rendered(
        ("bench", "batch")
    )


def test_the_method_lists_agree_with_the_registry():
    draft = methods_where(lambda m: m.needs_draft)
    one_row = methods_where(lambda m: not m.batches)
    assert draft and one_row and "bpd_neural" not in one_row and "specdec" not in one_row
    generate, serve = rendered(("generate",)), rendered(("serve",))
    for text in (generate, serve):
        assert listed(text, "Draft model (methods ", ").") == draft
        assert listed(text, "One of: ", ". Default") == set(METHODS)
    assert listed(generate, "Every method batches except ", " (a model draft") == one_row
    assert listed(serve, "every method but ", ", which serve one request at a time") == one_row
    assert listed(rendered(("bench", "batch")), "every method but ", "), each at") == one_row
    assert listed(rendered(("bench", "speed")), "Draft model (the hf_assisted rows and methods ", ").") == draft


def test_bench_runners_names_every_family():
    text = rendered(("bench", "speed"))
    assert listed(text, "the peers ", "; our methods") == set(PEER_FAMILIES)
    assert listed(text, "; our methods ", "; and <method>_aligned") == set(drafting_methods())
    assert all(b in text for b in BASELINES)


@pytest.mark.parametrize("command", ["generate", "serve", "bench speed"])
def test_declared_options_show_their_declared_defaults(command):
    text = rendered(tuple(command.split()))
    for name, (cls, f) in all_fields().items():
        opt = declaration(f)
        if opt is None or (command == "bench speed" and (cls is SharedOptions or name == "early_exit_layers")):
            continue
        start = text.index(f" {opt.flag} ")
        row = text[start : start + len(opt.help_text()) + 400]
        default = default_of(f)
        if default is not None and opt.parse is None:
            assert f"[default: {default}]" in row, (command, opt.flag, row)


def test_the_early_exit_help_names_the_layer_the_zoo_target_was_trained_at():
    layers = trained_exit_layers()
    assert layers.get("code") == 2  # zoo/code/target/training_report.json
    assert "The code zoo's target was trained to exit at layer 2: --zoo code --early-exit-layers 2." in rendered(
        ("generate",)
    )
