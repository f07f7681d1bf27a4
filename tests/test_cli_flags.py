"""The CLI's method-option flags come from the declarations: every declared option is a flag of `generate`,
`serve` and `bench` (bench: the drafters' own; it sweeps BiLD's thresholds and the layer counts as grids), with
the declared default, and reaches what runs."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from draftverify.bench.cli import rebuild_command
from draftverify.cli import app
from draftverify.options import SharedOptions, all_fields
from draftverify.options.declare import declaration, default_of
from draftverify.zoo import shipped

runner = CliRunner()


def command_params(*path: str) -> dict[str, object]:
    """flag -> click parameter of one command (its path: "generate", or "bench", "speed"), as typer builds it now."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {flag: p for p in command.params for flag in p.opts}


def declared(shared: bool):
    for name, (cls, f) in all_fields().items():
        opt = declaration(f)
        if opt is not None and (shared or cls is not SharedOptions):
            yield name, f, opt


def test_every_declared_option_is_a_flag_of_generate_and_serve_with_its_declared_default():
    for command in ("generate", "serve"):
        params = command_params(command)
        for name, f, opt in declared(shared=True):
            assert opt.flag in params, (command, opt.flag)
            param = params[opt.flag]
            assert param.name == name
            assert param.default == (None if opt.parse else default_of(f)), (command, name)


def test_every_drafter_option_is_a_flag_of_bench():
    params = command_params("bench", "speed")
    for name, f, opt in declared(shared=False):
        assert opt.flag in params, opt.flag
        if name != "early_exit_layers":  # bench's own comma list of layer counts to sweep
            assert params[opt.flag].default == (None if opt.parse else default_of(f)), name
    assert "--alpha-fb" not in params and "--bild-fb" in params


def test_the_help_lists_each_flag_with_its_help_and_methods():
    for command in (["generate"], ["serve"], ["bench", "speed"]):
        text = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"}).stdout
        for _, _, opt in declared(shared=command != ["bench", "speed"]):
            assert opt.flag in text, (command, opt.flag)
        assert "Methods: specdec, specdec++_nat." in text and shipped("nat") in text


def test_an_option_the_method_does_not_read_is_warned_about_before_loading(tmp_path):
    result = runner.invoke(
        app, ["generate", "--target", str(tmp_path), "--method", "prompt_lookup", "--prompt", "x", "--pbest", "2"]
    )
    assert result.exit_code == 2  # the empty folder, after the warning
    assert "warning: --pbest is used by bpd_pbest, not 'prompt_lookup'; ignored" in result.stderr


def test_a_missing_declared_file_and_bad_tree_paths_exit_2_before_loading(tmp_path):
    for command in (["generate", "--prompt", "x"], ["serve"]):
        result = runner.invoke(
            app, [*command, "--target", str(tmp_path), "--method", "bpd", "--heads", str(tmp_path / "nowhere")]
        )
        assert result.exit_code == 2 and "--heads" in result.stderr and "no such file or directory" in result.stderr
        assert "loading" not in result.stderr
    empty = runner.invoke(app, ["generate", "--prompt", "x", "--zoo", "code", "--method", "eagle3", "--eagle3", ""])
    assert (
        empty.exit_code == 2 and "--eagle3" in empty.stderr and "is empty: give a file or folder path" in empty.stderr
    )
    assert "loading" not in empty.stderr
    bad = runner.invoke(app, ["serve", "--target", str(tmp_path), "--method", "model_tree", "--tree-paths", "[0]"])
    assert bad.exit_code == 2 and "--tree-paths must be a JSON list of lists" in bad.stderr


def test_bench_takes_the_declared_flags():
    result = runner.invoke(app, ["bench", "speed", "--cost-curve", "--nat", "somewhere", "--bita-topk", "2"])
    assert result.exit_code == 2
    assert "--cost-curve does not use --bita-topk, --nat" in result.stderr
    command = rebuild_command({"quick": True, "zoo": None}, {"nat_path": "n", "bita_topk": 3, "pbest": 2})
    assert command == "draftverify bench speed --nat n --pbest 2 --quick"  # the default bita_topk is not repeated
