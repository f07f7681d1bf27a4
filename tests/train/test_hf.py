"""A run as transformers' Trainer: the schedule it steps the optimizer with."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from test_runner import _opts, _run  # noqa: E402

from draftverify.train.hf import lr_factor  # noqa: E402


def test_schedule_warms_up_then_decays_to_the_floor(tmp_path):
    r = _run(tmp_path / "s", _opts(warmup_steps=4, min_lr_ratio=0.1, max_steps=20))
    assert [lr_factor(r, i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(r, 10) == pytest.approx(0.55)
    assert lr_factor(r, 20) == pytest.approx(0.1) and lr_factor(r, 60) == pytest.approx(0.1)


def test_the_optimizer_steps_at_the_scheduled_rates(tmp_path):
    _run(tmp_path / "lr", _opts(warmup_steps=2, max_steps=4, min_lr_ratio=0.0)).fit()
    recs = [json.loads(line) for line in (tmp_path / "lr" / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in recs if not r.get("final")] == pytest.approx(
        [5e-3, 1e-2, 5e-3, 1e-2 * 0.5 * (1 + np.cos(0.75 * np.pi))], abs=1e-9
    )  # warm-up, then the cosine over the steps done before each: 2/4, 3/4
    assert all(r["grad_norm"] > 0 for r in recs if not r.get("final"))


def test_transformers_mixed_precision_is_the_options_bf16(tmp_path):
    from draftverify.train.hf import training_arguments

    assert training_arguments(_run(tmp_path / "a", _opts(bf16=True))).bf16
    assert not training_arguments(_run(tmp_path / "b", _opts(bf16=False))).bf16
