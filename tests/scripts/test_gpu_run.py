"""scripts/gpu_run.sh at toy size on the CPU: the GPU minutes are not lost to a typo. The same stages as on a GPU
(train heads, bita, nat on --data, export with cards, bench every method, cost curve) at bfloat16, the GPU's dtype,
into a tmp OUT: every piece and card appears, and the bench files name the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from conftest import save_llama

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_run.sh"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-run")
    save_llama(tmp / "target", layers=2, seed=0, tokenizer=AutoTokenizer.from_pretrained(ROOT / "zoo/code/tokenizer"))
    data = tmp / "data"
    for i in range(4):
        (data / f"pkg{i % 2}").mkdir(parents=True, exist_ok=True)
        (data / f"pkg{i % 2}" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n\n" * 20)
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "SCALE": "toy",
        "DTYPE": "bfloat16",
        "BENCH_DTYPE": "bfloat16",
        "OUT": str(tmp / "out"),
        "TARGET": str(tmp / "target"),
        "DATA": str(data),
        "WORK": str(tmp / "work"),
        "PYTHON": sys.executable,
    }
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=400)
    return tmp / "out", done


def test_every_stage_ran_in_its_budget(run):
    out, done = run
    assert done.returncode == 0, done.stderr
    stages = (out / "stages.txt").read_text()
    for name in ("heads", "bita", "nat", "eagle3", "bench_core", "bench", "cost"):
        assert f"] {name}: exit 0 after" in stages, stages
    assert "skipped" not in stages


def test_each_piece_is_exported_fp16_with_its_card(run):
    out, _ = run
    for piece in ("heads", "bita", "nat"):
        card = out / piece / "README.md"
        assert (out / piece / f"{piece}.safetensors").is_file() and (out / piece / f"{piece}.json").is_file()
        assert "--data" in card.read_text() and "--device cpu" in card.read_text()
    head = out / "eagle3"  # the EAGLE-3 checkpoint layout, with its card
    assert (head / "config.json").is_file() and (head / "model.safetensors").is_file()
    assert "--data" in (head / "README.md").read_text()


def test_the_bench_used_the_pieces_and_names_the_device(run):
    out, _ = run
    core = json.loads((out / "bench" / "bench-cpu-core.json").read_text())
    rest = json.loads((out / "bench" / "bench-cpu.json").read_text())
    for result in (core, rest):
        assert result["machine"]["device"] == "cpu" and result["config"]["dtype"] == "bfloat16"
        assert str(out / "heads") in result["command"] and str(out / "nat") in result["command"]
    assert "models on cpu" in (out / "bench" / "bench-cpu-core.md").read_text()
    rows = {r["runner"].split("[")[0]: r for r in core["runners"]}
    for method in ("bpd", "bita", "specdec"):
        assert rows[method]["equal_to_baseline"] == 1.0
    others = {r["runner"].split("[")[0] for r in rest["runners"]}
    assert {"early_exit", "prompt_lookup_tree"} <= others and not others & {"bpd", "bita", "specdec"}
    cost = json.loads((out / "cost" / "cost-cpu.json").read_text())
    assert cost["machine"]["device"] == "cpu" and [p["n"] for p in cost["modes"]["eager-float32"]["points"]] == [1, 2]
    assert (out / "device.txt").read_text().startswith("cpu")
