"""Every bench command writes into the benchmarks/ folder of what it measures unless told otherwise."""

from __future__ import annotations

import inspect
from pathlib import Path

from draftverify.bench import folders
from draftverify.bench.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_the_folders_exist_in_the_checkout_and_each_command_defaults_to_one():
    named = {name: value for name, value in vars(folders).items() if name.isupper() and name != "BENCHMARKS"}
    for path in named.values():
        assert path.parent == folders.BENCHMARKS and (ROOT / path).is_dir(), path
    expected = {
        "bench-ab": folders.DRAFT_POLICY,
        "bench-rounds": folders.SPEED,
        "bench-cold-start": folders.SPEED,
        "bench-overhead": folders.COST,
        "bench-samples": folders.METHODS,
        "bench-replay": folders.METHODS,
        "bench-serve": None,
        "bench-serve-llamacpp": None,
    }
    for name, command in COMMANDS.items():
        assert inspect.signature(command).parameters["out"].default.default == expected[name], name
