"""What a recipe's run adds to transformers' Trainer as callbacks: the budgets and stops (Budget) and the progress
line with the JSONL log (ProgressLine)."""

from __future__ import annotations

import signal
import time
from typing import Any, Optional

from transformers import TrainerCallback

# a run's `run` arguments are train/runner.py's Run, not imported here: runner imports this module


def _several_processes() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _from_rank_zero(values: list[float], device) -> list[float]:
    """values as process 0 has them (the wall clock and a signal differ between processes; the decisions taken on
    them must not), or as they are in a single process."""
    import torch
    import torch.distributed as dist

    if not _several_processes():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.tolist()


def _summed(counts: dict[str, int], device) -> dict[str, int]:
    """Each count summed over the processes (each trained on its own batch), or as it is in a single process."""
    import torch
    import torch.distributed as dist

    if not _several_processes() or not counts:
        return counts
    names = sorted(counts)
    t = torch.tensor([counts[k] for k in names], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: int(v) for k, v in zip(names, t.tolist())}


class Budget(TrainerCallback):
    """Ends the run's steps: at its step or wall-clock budget (after the final held-out evaluation), at `until` (a
    fraction of the run), after `stop_after_steps` steps of this fit() (a test hook) or on SIGINT/SIGTERM, each with
    a checkpoint; checkpoints every checkpoint_minutes and runs the held-out evaluation at its cadence. The run's
    elapsed time counts across resumes. reason names the stop that was not a budget (None otherwise)."""

    def __init__(self, run, stop_after_steps: Optional[int], until: Optional[float]):
        self.run, self.stop_after_steps, self.until = run, stop_after_steps, until
        self.reason: Optional[str] = None
        self.signalled: Optional[str] = None

    def on_signal(self, signum: int, frame: Any) -> None:
        self.signalled = signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.base, self.start_step = time.time(), self.run.state["elapsed"], state.global_step
        self.last_ckpt = self.last_eval = self.base

    def on_step_end(self, args, state, control, **kwargs):
        run, o = self.run, self.run.opts
        elapsed, signalled = _from_rank_zero(
            [self.base + time.time() - self.t0, float(bool(self.signalled))], args.device
        )
        run.state["step"], run.state["elapsed"] = state.global_step, elapsed
        for k, n in _summed(run.pending_counts, args.device).items():
            run.state[k] = run.state.get(k, 0) + n
        run.pending_counts = {}
        if run.done():
            run.run_evaluation()
            run.evaluated_at = state.global_step
            run.state["finished"] = True
        elif self._eval_due():
            run.run_evaluation()
            run.evaluated_at = state.global_step
            self.last_eval = elapsed
        if run.evaluated_at == state.global_step:
            control.should_log = True
        stop = run.done() or (self.until is not None and run.progress() >= self.until)
        if signalled:
            self.reason = self.signalled or "signal"
        elif self.stop_after_steps is not None and state.global_step - self.start_step >= self.stop_after_steps:
            self.reason = "stop_after_steps"
        if stop or self.reason is not None:
            control.should_training_stop = control.should_save = True
        elif elapsed - self.last_ckpt >= o.checkpoint_minutes * 60:
            control.should_save = True
        if control.should_save:
            self.last_ckpt = elapsed
        return control

    def _eval_due(self) -> bool:
        run, o = self.run, self.run.opts
        if run.evaluate is None:
            return False
        if o.eval_every_steps:
            return run.state["step"] % o.eval_every_steps == 0
        return o.eval_minutes is not None and run.state["elapsed"] - self.last_eval >= o.eval_minutes * 60

    def on_save(self, args, state, control, **kwargs):
        from .settings import CHECKPOINT_PREFIX

        checkpoint = self.run.run_dir / f"{CHECKPOINT_PREFIX}{state.global_step}"
        if self.run.is_main:
            self.run.save_state(checkpoint)
        self.run.checkpoint = checkpoint
        return control


class ProgressLine(TrainerCallback):
    """At each of transformers' logs (every log_every steps, and at each held-out evaluation): one JSONL record in
    run_dir/log.jsonl and a line on the run's log (training loss averaged since the last, learning rate, gradient
    norm, the held-out figure, tokens/s); or a tqdm bar when opts.use_progress, updated every step."""

    def __init__(self, run):
        self.run, self.bar = run, None

    def on_train_begin(self, args, state, control, **kwargs):
        run = self.run
        self.win_t0, self.win_tokens = time.time(), run.state.get("tokens_seen", 0)
        if run.opts.use_progress and run.is_main:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=run.opts.max_steps, initial=state.global_step, unit="step", desc=run.desc, dynamic_ncols=True
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            run = self.run
            self.bar.update(1)
            cur = run.state[run.metric]
            shown = {} if run.evaluate is None else {run.metric: "-" if cur is None else f"{cur:.3f}"}
            self.bar.set_postfix(**shown, min=f"{run.state['elapsed'] / 60:.1f}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        run = self.run
        if not logs or "loss" not in logs:  # transformers' end-of-training summary
            return
        val = run.state[run.metric] if run.evaluated_at == state.global_step else None
        rec = {
            "step": state.global_step,
            "elapsed": round(run.state["elapsed"], 2),
            "train_loss": round(logs["loss"], 5),
            run.metric: None if val is None else round(val, 5),
            "lr": logs.get("learning_rate"),
            "grad_norm": None if logs.get("grad_norm") is None else round(logs["grad_norm"], 4),
        }
        tok_s = 0.0
        if "tokens_seen" in run.state:
            dt = time.time() - self.win_t0
            tok_s = (run.state["tokens_seen"] - self.win_tokens) / dt if dt > 0 else 0.0
            rec.update(tokens_seen=run.state["tokens_seen"], tokens_per_s=round(tok_s, 1))
            self.win_t0, self.win_tokens = time.time(), run.state["tokens_seen"]
        run.last_lr = rec["lr"]
        run.write_log(rec)
        if self.bar is None and run.is_main:
            speed = f" | {tok_s:,.0f} tok/s | {run.state['tokens_seen']:,} tok" if "tokens_seen" in run.state else ""
            run.log(
                f"{run.prefix}step {state.global_step:>6} | loss {logs['loss']:.4f}{run.metric_text(val)} | "
                f"lr {rec['lr']:.2e}{speed} | {run.state['elapsed'] / 60:.1f} min"
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
