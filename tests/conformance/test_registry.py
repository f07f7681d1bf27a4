"""The suite follows the registry: a method registered here (a new drafter name, with the options it reads) is
among the cases and held to its promise with no edit to the suite, its pieces built from what it declares; a
method that needs something the suite cannot build fails, naming the method and the need."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from draftverify.drafters import NgramDrafter
from draftverify.options import NgramOptions, option
from draftverify.registry import DrafterSpec, MethodEntry, register_methods, unregister_methods

from .cases import MODES, cases, check
from .conftest import declared_needs
from .pieces import MissingBuilder


@dataclass(frozen=True)
class ToyWeightsOptions:
    toy_weights: Path | None = option(
        None, "--toy-weights", "The toy's weights file.", zoo="toy.bin", what="toy weights"
    )


class ToyNgramDrafter(NgramDrafter):
    """The n-gram drafter under another name: a new method that reads an n-gram table."""


@pytest.fixture
def register(monkeypatch):
    """register(method, drafter class, options classes): the method's registration, undone after the test."""
    added: list[str] = []

    def add(name: str, drafter: type, *options: type) -> None:
        monkeypatch.setattr(drafter, "name", name, raising=False)
        register_methods(
            DrafterSpec(name, drafter, methods={name: MethodEntry(f"{name}: registered by a test")}, options=options)
        )
        added.append(name)

    yield add
    for name in added:
        unregister_methods(name)


def test_a_new_method_is_a_case_and_keeps_its_promise_with_no_edit_to_the_suite(register, subjects):
    register("toy_ngram", ToyNgramDrafter, NgramOptions)
    assert {p.id for p in cases() if p.values[0] == "toy_ngram"} >= {
        "toy_ngram-hf-llama-greedy",
        "toy_ngram-hf-t5-seeded",
    }
    assert declared_needs("toy_ngram") == {"ngram_path": "n-gram table"}
    for mode in MODES.values():
        check(subjects("hf", "llama"), "toy_ngram", mode)


def test_a_method_whose_needs_the_suite_cannot_build_fails_naming_it(register, subjects):
    register("toy_weighted", ToyNgramDrafter, ToyWeightsOptions)
    with pytest.raises(MissingBuilder, match="method 'toy_weighted' needs toy_weights \\(toy weights\\)"):
        check(subjects("hf", "llama"), "toy_weighted", MODES["greedy"])
