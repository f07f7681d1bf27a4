"""The llama.cpp backend's cost curve: one forward over k tokens timed once per file, threads and flash attention,
kept beside the file, read back on the next load, measured again when the file changes or the record is
unreadable; a pipeline whose gamma reads timings starts from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from conftest import tiny_gguf_pair  # noqa: E402
from draftverify.backends import llamacpp_cost  # noqa: E402
from draftverify.backends.gguf import converter_available  # noqa: E402
from draftverify.backends.llamacpp import GGUFModel, LlamaCppLM  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)
ZOO = Path(__file__).resolve().parents[2] / "zoo" / "code"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf_pair(tmp_path_factory.mktemp("llamacpp-cost"), ZOO / "tokenizer")


def test_the_curve_is_measured_once_kept_beside_the_file_and_read_back(tiny, monkeypatch):
    lm = LlamaCppLM(tiny["target"], threads=1)
    path = llamacpp_cost.curve_path(lm)
    path.unlink(missing_ok=True)
    curve = lm.cost_curve()
    assert sorted(curve) == list(llamacpp_cost.WIDTHS) and all(s > 0 for s in curve.values())
    assert curve[32] > curve[1]  # 32 tokens cost more than one, even on a tiny model
    assert path.parent == Path(tiny["target"].path).resolve().parent
    assert json.loads(path.read_text())["seconds"] == {str(k): v for k, v in curve.items()}

    def measured_again(_):
        raise AssertionError("measured again")

    monkeypatch.setattr(llamacpp_cost, "measure", measured_again)
    assert LlamaCppLM(tiny["target"], threads=1).cost_curve() == curve
    assert llamacpp_cost.curve_path(LlamaCppLM(tiny["target"], threads=2)) != path  # per thread count


def test_an_unreadable_record_or_a_rewritten_file_is_measured_again(tiny, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(Path(tiny["target"].path).read_bytes())
    lm = LlamaCppLM(GGUFModel(copy), threads=1)
    path = llamacpp_cost.curve_path(lm)
    path.write_text("{not json")
    assert sorted(lm.cost_curve()) == list(llamacpp_cost.WIDTHS)
    assert json.loads(path.read_text())["threads"] == 1
    os.utime(copy, ns=(0, 0))  # the file changed (as far as its record can tell)
    assert llamacpp_cost.curve_path(lm) != path


def test_a_pipeline_with_a_timing_gamma_starts_from_the_curve(tiny, tmp_path):
    from draftverify import load

    target = str(tiny["target"].path)
    fixed = load(target=target, method="prompt_lookup", backend="llamacpp", threads=1, gamma=4)
    fixed.generate("def f(x):", max_new_tokens=4)
    assert not fixed.step_costs.seeded  # a fixed length reads no timing: nothing measured
    timed = load(target=target, method="prompt_lookup", backend="llamacpp", threads=1, gamma="auto")
    assert not timed.step_costs.seeded
    timed.generate("def f(x):", max_new_tokens=4)
    assert timed.step_costs.seeded and timed.step_costs.slope_known
