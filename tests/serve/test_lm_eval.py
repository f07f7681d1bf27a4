"""lm-evaluation-harness as a real client: its `local-completions` model against `draftverify serve --zoo code`
(speculation on: the zoo's own method) scores the tiny tasks shipped in tests/serve/lm_eval_tasks (one log-likelihood
task, one generate-until task) exactly as its `hf` model scores the zoo's target folder: the same metrics, the same
answers, the same log-likelihoods. Offline: the tasks read local jsonl files and the tokenizer is the zoo's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_fixtures import ServerProcess

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the test extra has it)")

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "zoo" / "code" / "target"
TASKS = ("draftverify_code_mc", "draftverify_code_gen")


def lm_eval(model: str, model_args: str, out: Path, cache: Path) -> tuple[dict, dict]:
    """One lm-eval run from the repository's root (where the tasks' data_files point), offline; its results and
    each task's samples by doc id."""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(cache),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args]
    command += ["--tasks", ",".join(TASKS), "--include_path", "tests/serve/lm_eval_tasks", "--batch_size", "1"]
    command += ["--output_path", str(out), "--log_samples", "--seed", "1234"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {}
    for task in TASKS:
        lines = next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()
        samples[task] = {s["doc_id"]: s for s in map(json.loads, lines)}
    return results["results"], samples


@pytest.fixture(scope="module")
def server():
    # --no-heal: lm-eval's hf model decodes after the prompt's own last token, as a server that does not heal
    proc = ServerProcess(["--zoo", "code", "--no-heal", "--threads", "1"], startup_s=300)
    yield proc
    proc.stop()


def test_lm_eval_through_the_server_scores_as_its_hf_model(server, tmp_path):
    args = f"model=code,base_url={server.base}/v1/completions,tokenizer_backend=huggingface,tokenizer={TARGET}"
    ours, our_samples = lm_eval("local-completions", args + ",tokenized_requests=True", tmp_path / "ours", tmp_path)
    hf, hf_samples = lm_eval("hf", f"pretrained={TARGET},dtype=float32", tmp_path / "hf", tmp_path)
    mc, gen = TASKS
    for metric in ("acc,none", "acc_norm,none"):
        assert ours[mc][metric] == hf[mc][metric]
    assert ours[gen]["exact_match,none"] == hf[gen]["exact_match,none"]
    # each answer: the choices' log-likelihoods (and whether each is the greedy continuation), the generated text
    assert our_samples[mc].keys() == hf_samples[mc].keys() and len(our_samples[mc]) == 6
    for doc, sample in our_samples[mc].items():
        for (ll, greedy), (ll_hf, greedy_hf) in zip(sample["filtered_resps"], hf_samples[mc][doc]["filtered_resps"]):
            assert float(ll) == pytest.approx(float(ll_hf), abs=1e-3) and greedy == greedy_hf
    assert len(our_samples[gen]) == 4
    for doc, sample in our_samples[gen].items():
        assert sample["filtered_resps"] == hf_samples[gen][doc]["filtered_resps"]
    assert any(r[0].strip() for s in our_samples[gen].values() for r in [s["filtered_resps"]])  # it did generate
