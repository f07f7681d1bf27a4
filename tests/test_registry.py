"""The method registry (registry.py): each declaration agrees with the classes it names (whether its methods batch,
whether they are lossless), a drafter class is imported only when looked up, and a name taken twice is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from draftverify.methods import METHODS, build_verifier, registered_methods
from draftverify.options import MethodOptions
from draftverify.registry import (
    DRAFTER_OPTIONS,
    DRAFTERS,
    SPECS,
    DrafterSpec,
    MethodEntry,
    register_methods,
    unregister_methods,
)
from draftverify.types import SamplingParams

LOSSY_VERIFIERS = {"bild", "topbeta"}  # they trade the target's distribution for speed


def test_every_declaration_says_what_its_classes_do():
    for method in registered_methods():
        drafter = method.drafter_class()
        verifier = build_verifier(method.verifier, SamplingParams(), MethodOptions())
        assert method.batches == (drafter.supports_batch and verifier.supports_batch), method.name
        assert method.lossless == (method.verifier not in LOSSY_VERIFIERS), method.name
        assert drafter.name == method.drafter and isinstance(method.needs_target_modules, str)
    assert [m.name for m in registered_methods()] == list(METHODS)
    assert {"autoregressive", "model", "bpd_neural", "specdec", "bita_chain", "specdec++_nat"} <= set(METHODS)


def test_the_declarations_import_no_drafter_until_one_is_looked_up():
    code = (
        "import sys; from draftverify.methods import METHODS, registered_methods; m = registered_methods();"
        "print(len(m), 'torch' in sys.modules, 'draftverify.drafters.nat' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[1:] == ["False", "False"], out.stderr


class Plain:
    supports_batch = False


def test_a_declaration_that_disagrees_with_its_class_is_refused():
    with pytest.raises(RuntimeError, match="declared with batches=True but Plain.supports_batch is False"):
        register_methods(DrafterSpec("plain", Plain, methods={"plain": MethodEntry("x")}))
    assert "plain" not in DRAFTERS and "plain" not in SPECS
    register_methods(
        DrafterSpec(
            "plain",
            "test_registry:Plain",
            batches=False,
            methods={"plain": MethodEntry("x"), "plain_lossy": MethodEntry("y", verifier="bild", lossless=False)},
        )
    )
    try:
        assert METHODS["plain"].batches is False and METHODS["plain_lossy"].lossless is False
        assert DRAFTERS["plain"] is Plain and Plain.name == "plain" and "plain" not in DRAFTER_OPTIONS
        with pytest.raises(RuntimeError, match="drafter 'plain' registered twice"):
            register_methods(DrafterSpec("plain", Plain, batches=False, methods={}))
        with pytest.raises(RuntimeError, match=r"method\(s\) plain registered twice"):
            register_methods(DrafterSpec("other", Plain, batches=False, methods={"plain": MethodEntry("x")}))
    finally:
        unregister_methods("plain")
    assert "plain" not in METHODS and "plain" not in DRAFTERS and "plain" not in SPECS and "other" not in SPECS
