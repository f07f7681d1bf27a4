"""Every bench suite writes into the benchmarks/ folder of what it measures unless told otherwise."""

from __future__ import annotations

import inspect
from pathlib import Path

from draftverify.bench import folders
from draftverify.bench.commands import SUITES

ROOT = Path(__file__).resolve().parents[2]


def test_the_folders_exist_in_the_checkout_and_each_command_defaults_to_one():
    named = {name: value for name, value in vars(folders).items() if name.isupper() and name != "BENCHMARKS"}
    for path in named.values():
        assert path.parent == folders.BENCHMARKS and (ROOT / path).is_dir(), path
    expected = {
        "speed": None,  # SPEED, or COST with --cost-curve: chosen when it runs
        "batch": folders.BATCH,
        "ab": folders.DRAFT_POLICY,
        "rounds": folders.SPEED,
        "native": folders.SPEED,
        "synthetic": folders.SPEED,
        "cold-start": folders.SPEED,
        "overhead": folders.COST,
        "samples": folders.METHODS,
        "replay": folders.METHODS,
        "serve": None,
        "serve-llamacpp": None,
    }
    for name, command in SUITES.items():
        assert inspect.signature(command).parameters["out"].default.default == expected[name], name
