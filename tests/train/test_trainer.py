"""The shared training loop on its own: a tiny Llama learning a fixed random token stream."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftverify.train import trainer as tr  # noqa: E402
from draftverify.train.losses import lm_loss  # noqa: E402
from draftverify.train.presets import make_config  # noqa: E402

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


def _opts(**kw) -> tr.TrainerOptions:
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
    return tr.TrainerOptions(**base)


def _draw(rng):
    starts = rng.integers(0, len(DATA) - SEQ - 1, size=4)
    return torch.from_numpy(np.stack([DATA[s : s + SEQ + 1] for s in starts]))


def _trainer(run_dir, opts, log=_quiet, loss=None, evaluate=None, key=None):
    from transformers import LlamaForCausalLM

    tr.seed_everything(opts.seed)
    model = LlamaForCausalLM(make_config("tiny", VOCAB, 0, **TINY))
    return tr.Trainer(
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


def _same_run(a, b):
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for pid, st in a["optimizer"]["state"].items():
        assert torch.equal(st["exp_avg_sq"], b["optimizer"]["state"][pid]["exp_avg_sq"])
    assert a["state"]["step"] == b["state"]["step"] and a["state"]["tokens_seen"] == b["state"]["tokens_seen"]


def test_resume_after_interruption_is_the_uninterrupted_run(tmp_path):
    ref = _trainer(tmp_path / "ref", _opts()).fit()
    assert not ref["stopped"] and ref["step"] == 8 and ref["finished"]

    part = _trainer(tmp_path / "run", _opts()).fit(stop_after_steps=3)
    assert part["stopped"] and part["step"] == 3 and not part["finished"]
    msgs = []
    t = _trainer(tmp_path / "run", _opts(), log=msgs.append)  # a fresh process would build a fresh model
    assert t.resumed and any("resumed" in m and "step 3" in m for m in msgs)
    full = t.fit()
    assert full["step"] == 8 and full["resumes"] == 1
    assert full["commands"] == ["test", "test"]
    _same_run(tr.load_checkpoint(tmp_path / "ref"), tr.load_checkpoint(tmp_path / "run"))
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()
        if json.loads(line)["train_loss"] is not None
    ]
    assert steps == list(range(1, 9))


def test_a_signal_checkpoints_and_the_rerun_finishes_the_same_run(tmp_path):
    ref = _trainer(tmp_path / "ref", _opts()).fit()
    calls = {"n": 0}

    def loss(m, x):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during step 5: that step completes, then it stops
        return lm_loss(m, x, False)

    old = signal.getsignal(signal.SIGINT)
    part = _trainer(tmp_path / "run", _opts(), loss=loss).fit()
    assert signal.getsignal(signal.SIGINT) is old  # the trainer's handler is gone again
    assert part["stopped"] and part["step"] == 5
    assert tr.load_checkpoint(tmp_path / "run")["state"]["step"] == 5
    assert _trainer(tmp_path / "run", _opts()).fit()["step"] == ref["step"]
    _same_run(tr.load_checkpoint(tmp_path / "ref"), tr.load_checkpoint(tmp_path / "run"))


def test_step_and_time_budgets_stop_the_run(tmp_path):
    assert _trainer(tmp_path / "steps", _opts(max_steps=3)).fit()["step"] == 3
    # a finished run rerun does no further step
    assert _trainer(tmp_path / "steps", _opts(max_steps=3)).fit()["step"] == 3
    t = _trainer(tmp_path / "time", _opts(max_steps=None, max_minutes=0.005))  # 0.3 s
    out = t.fit()
    assert not out["stopped"] and 0 < out["step"] < 10_000
    assert out["elapsed"] >= 0.3
    assert t.progress() >= 1.0 and t.sched.last_progress > 0.5  # the cosine ran over the time budget
    # both given: whichever comes first
    assert _trainer(tmp_path / "both", _opts(max_steps=2, max_minutes=60)).fit()["step"] == 2


def test_schedule_warms_up_then_decays_to_the_floor():
    s = tr.WarmupCosine(1.0, warmup_steps=4, min_ratio=0.1)
    assert [s.lr(i, 0.0) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.lr(10, 0.5) == pytest.approx(0.55)
    assert s.lr(10, 1.0) == pytest.approx(0.1) and s.lr(10, 3.0) == pytest.approx(0.1)


def test_evaluation_cadence_and_best(tmp_path):
    vals = iter([3.0, 1.0, 2.0, 0.5])
    out = _trainer(tmp_path / "e", _opts(max_steps=6, eval_every_steps=2), evaluate=lambda m: next(vals)).fit()
    recs = [json.loads(line) for line in (tmp_path / "e" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["val_loss"] is not None] == [2, 4, 6, 6]  # every 2 steps, then final
    assert recs[-1]["final"] and recs[-1]["val_loss"] == 0.5
    assert out["val_loss"] == 0.5 and out["best_val_loss"] == 0.5


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_steps=None, max_minutes=None), "give --max-steps and/or --max-minutes"),
        (dict(max_steps=0), "--max-steps must be positive"),
        (dict(max_minutes=-1.0), "--max-minutes must be positive"),
        (dict(lr=0.0), "--lr must be positive"),
        (dict(batch_size=0), "--batch-size must be positive"),
        (dict(threads=0), "--threads must be positive"),
        (dict(eval_every_steps=0), "--eval-every-steps must be positive"),
        (dict(warmup_steps=-1), "--warmup-steps must be >= 0"),
        (dict(min_lr_ratio=1.5), r"--min-lr-ratio must be in \[0, 1\]"),
        (dict(grad_clip=0.0), "--grad-clip must be positive"),
    ],
)
def test_bad_options_are_rejected(kw, message):
    with pytest.raises(tr.TrainError, match=message):
        _opts(**kw).validate_run()


def test_a_diverging_loss_stops_with_a_clear_error(tmp_path):
    with pytest.raises(tr.TrainError, match="loss became nan at step 0; try a lower --lr"):
        _trainer(tmp_path / "nan", _opts(), loss=lambda m, x: lm_loss(m, x, False) * float("nan")).fit()


def test_checkpoint_survives_a_crash_between_renames(tmp_path):
    _trainer(tmp_path / "c", _opts(max_steps=2)).fit()
    (tmp_path / "c" / "checkpoint").rename(tmp_path / "c" / "checkpoint.old")
    assert tr.load_checkpoint(tmp_path / "c")["state"]["step"] == 2
    assert tr.load_checkpoint(tmp_path / "nothing") is None


def test_a_checkpoint_of_other_settings_starts_over_and_names_them(tmp_path):
    key = {"data": "a", **_opts().optimizer_key()}
    _trainer(tmp_path / "k", _opts(max_steps=3), key=key).fit()
    msgs = []
    other = {**key, "data": "b", "lr": 5e-3}
    t = _trainer(tmp_path / "k", _opts(max_steps=4, lr=5e-3), key=other, log=msgs.append)
    assert not t.resumed and t.state["step"] == 0
    assert any("was trained with other settings (data, lr differ); starting over" in m for m in msgs)
    assert t.fit()["step"] == 4 and tr.load_checkpoint(tmp_path / "k")["state"]["key"] == other
    msgs.clear()
    t = _trainer(tmp_path / "k", _opts(max_steps=6, lr=5e-3), key=other, log=msgs.append)  # a larger budget alone
    assert t.resumed and any("resumed" in m and "step 4" in m for m in msgs)
    assert t.fit()["step"] == 6
    assert any("done: step 6 |" in m for m in msgs) and not any("val loss" in m for m in msgs)  # nothing evaluates
