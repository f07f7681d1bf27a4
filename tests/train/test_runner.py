"""A recipe's run on transformers' Trainer, on its own: a tiny Llama learning a fixed random token stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from checkpoints import assert_same_run, weights  # noqa: E402

from draftverify.train import runner as rn  # noqa: E402
from draftverify.train.losses import lm_loss  # noqa: E402
from draftverify.train.presets import make_config  # noqa: E402
from draftverify.train.settings import RunOptions, TrainError, seed_everything  # noqa: E402

TINY = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=32,
    max_position_embeddings=64,
)
VOCAB, SEQ = 40, 8
DATA = np.random.default_rng(0).integers(0, VOCAB, size=2000)


def _quiet(msg):
    pass


def _opts(**kw) -> RunOptions:
    base = dict(
        lr=1e-2,
        warmup_steps=2,
        max_steps=8,
        batch_size=4,
        threads=1,
        bf16=False,
        log_every=1,
        checkpoint_minutes=1000,
        progress=False,
        command="test",
    )
    base.update(kw)
    return RunOptions(**base)


def _draw(rng):
    starts = rng.integers(0, len(DATA) - SEQ - 1, size=4)
    return torch.from_numpy(np.stack([DATA[s : s + SEQ + 1] for s in starts]))


def _run(run_dir, opts, log=_quiet, loss=None, evaluate=None, key=None):
    from transformers import LlamaForCausalLM

    seed_everything(opts.seed)
    model = LlamaForCausalLM(make_config("tiny", VOCAB, 0, **TINY))
    return rn.Run(
        model,
        opts,
        run_dir,
        batches=_draw,
        loss=loss or (lambda m, x: lm_loss(m, x, False)),
        evaluate=evaluate,
        counts=lambda x: {"tokens_seen": x.size(0) * SEQ},
        key=key,
        log=log,
    )


def _train_steps(run_dir):
    recs = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r["step"] for r in recs if r["train_loss"] is not None]


def test_resume_after_interruption_is_the_uninterrupted_run(tmp_path):
    ref = _run(tmp_path / "ref", _opts()).fit()
    assert not ref["stopped"] and ref["step"] == 8 and ref["finished"]

    part = _run(tmp_path / "run", _opts()).fit(stop_after_steps=3)
    assert part["stopped"] and part["step"] == 3 and not part["finished"]
    assert rn.last_checkpoint(tmp_path / "run").name == "checkpoint-3"
    msgs = []
    r = _run(tmp_path / "run", _opts(), log=msgs.append)  # a fresh process would build a fresh model
    assert r.resumed and any("resumed" in m and "step 3" in m for m in msgs)
    full = r.fit()
    assert full["step"] == 8 and full["resumes"] == 1 and full["tokens_seen"] == 8 * 4 * SEQ
    assert full["commands"] == ["test", "test"]
    assert_same_run(tmp_path / "ref", tmp_path / "run")
    assert _train_steps(tmp_path / "run") == list(range(1, 9))
    assert [p.name for p in (tmp_path / "run").glob("checkpoint-*")] == ["checkpoint-8"]  # transformers rotates them


def test_a_signal_checkpoints_and_the_rerun_finishes_the_same_run(tmp_path):
    _run(tmp_path / "ref", _opts()).fit()
    calls = {"n": 0}

    def loss(m, x):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during step 5: that step completes, then it stops
        return lm_loss(m, x, False)

    old = signal.getsignal(signal.SIGINT)
    part = _run(tmp_path / "run", _opts(), loss=loss).fit()
    assert signal.getsignal(signal.SIGINT) is old  # the run's handler is gone again
    assert part["stopped"] and part["step"] == 5
    assert rn.load_checkpoint(tmp_path / "run")["state"]["step"] == 5
    assert _run(tmp_path / "run", _opts()).fit()["step"] == 8
    assert_same_run(tmp_path / "ref", tmp_path / "run")


def test_step_and_time_budgets_stop_the_run(tmp_path):
    assert _run(tmp_path / "steps", _opts(max_steps=3)).fit()["step"] == 3
    # a finished run rerun does no further step, and has the checkpoint's weights
    again = _run(tmp_path / "steps", _opts(max_steps=3))
    assert again.fit()["step"] == 3
    w = weights(tmp_path / "steps")
    assert torch.equal(again.model.state_dict()["model.embed_tokens.weight"], w["model.embed_tokens.weight"])
    r = _run(tmp_path / "time", _opts(max_steps=None, max_minutes=0.005))  # 0.3 s
    out = r.fit()
    assert not out["stopped"] and 0 < out["step"] < 10_000
    assert out["elapsed"] >= 0.3 and r.progress() >= 1.0
    assert r.last_lr < 0.5 * r.opts.lr  # the cosine ran over the time budget
    # both given: whichever comes first
    assert _run(tmp_path / "both", _opts(max_steps=2, max_minutes=60)).fit()["step"] == 2


def test_evaluation_cadence_and_best(tmp_path):
    vals = iter([3.0, 1.0, 2.0, 0.5])
    out = _run(tmp_path / "e", _opts(max_steps=6, eval_every_steps=2), evaluate=lambda m: next(vals)).fit()
    recs = [json.loads(line) for line in (tmp_path / "e" / "log.jsonl").read_text().splitlines()]
    # every 2 steps; at the last step the final evaluation takes the cadence's place
    assert [r["step"] for r in recs if r["val_loss"] is not None] == [2, 4, 6, 6]
    assert recs[-1]["final"] and recs[-1]["val_loss"] == 2.0
    assert out["val_loss"] == 2.0 and out["best_val_loss"] == 1.0


def test_a_diverging_loss_stops_with_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match="loss became nan at step 0; try a lower --lr"):
        _run(tmp_path / "nan", _opts(), loss=lambda m, x: lm_loss(m, x, False) * float("nan")).fit()


def test_a_checkpoint_of_other_settings_starts_over_and_names_them(tmp_path):
    key = {"data": "a", **_opts().optimizer_key()}
    _run(tmp_path / "k", _opts(max_steps=3), key=key).fit()
    msgs = []
    other = {**key, "data": "b", "lr": 5e-3}
    r = _run(tmp_path / "k", _opts(max_steps=4, lr=5e-3), key=other, log=msgs.append)
    assert not r.resumed and r.state["step"] == 0
    assert any("was trained with other settings (data, lr differ); starting over" in m for m in msgs)
    assert r.fit()["step"] == 4 and rn.load_checkpoint(tmp_path / "k")["state"]["key"] == other
    msgs.clear()
    r = _run(tmp_path / "k", _opts(max_steps=6, lr=5e-3), key=other, log=msgs.append)  # a larger budget alone
    assert r.resumed and any("resumed" in m and "step 4" in m for m in msgs)
    assert r.fit()["step"] == 6
    assert any("done: step 6 |" in m for m in msgs) and not any("val loss" in m for m in msgs)  # nothing evaluates


TWO_PROCESSES = """
import sys
sys.path.insert(0, {tests!r})
from test_runner import _opts, _run
from draftverify.train.runner import end_processes
out = _run({run_dir!r}, _opts(max_steps=3)).fit()
end_processes()
assert out["step"] == 3 and out["finished"], out
"""


def test_two_processes_train_one_model_under_torchrun(tmp_path):
    """The command the training docs give for several GPUs, on two CPU processes (gloo): both train, one writes."""
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES.format(tests=str(Path(__file__).parent), run_dir=str(tmp_path / "ddp")))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = rn.load_checkpoint(tmp_path / "ddp")["state"]
    assert state["step"] == 3 and state["tokens_seen"] == 2 * 3 * 4 * SEQ  # both processes' batches counted
    assert _train_steps(tmp_path / "ddp") == [1, 2, 3]  # one process writes the log
