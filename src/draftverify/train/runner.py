"""The training run every recipe (`train lm`, `train align`, `train heads`, ...) hands its model to, on transformers'
``Trainer``.

A recipe decides *what* to learn (its batches, its loss, its held-out figure); transformers' Trainer (on accelerate)
does the rest: AdamW, gradient clipping, bf16 mixed precision, the device (``--device``, or one process per GPU or
machine under ``torchrun`` / ``accelerate launch``), checkpoints (model, optimizer, schedule, RNG states) and resume.
What it has no setting for is added here as callbacks (train/callbacks.py): the wall-clock budget, the schedule over
it, the checkpoint interval in minutes, the held-out evaluation, the progress line and the JSONL log, and stopping on
SIGINT/SIGTERM with a checkpoint. The run's own figures (``state``: elapsed time, counters, the held-out figure, the
recipe's fields) are kept next to each checkpoint in ``run_state.json``.

Writing a recipe::

    seed_everything(opts.seed)               # before the model is built: its init uses torch's RNG
    model = ...                              # float32, train mode, on opts.torch_device()
    run = Run(model, opts, run_dir,
              batches=lambda rng: draw(rng),            # one batch from a numpy generator seeded with opts.seed
              loss=lambda model, batch: scalar_loss,    # the batch's tensors on the model's device
              evaluate=lambda model: held_out_loss,     # optional; stored as state[metric]
              counts=lambda batch: {"tokens_seen": n},  # optional per-step counters in state
              state={"my_field": None},                 # extra fields, saved with each checkpoint
              key={"data": sha, **opts.optimizer_key()})  # optional: what a checkpoint must match to be
                                                        # resumed (never a budget)
    result = run.fit()                       # resumes from run_dir's last checkpoint if there is one
    if result["stopped"]: ...                # interrupted: checkpoint written, nothing to export
    else: export(model)

A resumed run takes the steps an uninterrupted one would have taken: the batch generator is replayed to the step
the checkpoint was taken at (transformers skips the batches already trained on) and the RNG states are restored.
A recipe whose objective changes part-way through one schedule calls ``fit(until=fraction)``, then sets ``run.loss``
and calls ``fit()`` again (`train lm --early-exit-layer`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..bench.environment import command_line
from .settings import CHECKPOINT_PREFIX, RunOptions, model_config

RUN_STATE = "run_state.json"  # the run's figures, next to each checkpoint's weights


def end_processes() -> None:
    """Close the process group a run under ``torchrun`` / ``accelerate launch`` opened (accelerate opens it, nothing
    closes it): every process waits for the others, then the group is destroyed. A process that exits with the group
    still open can abort in gloo's teardown ("terminate called without an active exception") after its work is
    done, which fails the launcher. No-op in a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def last_checkpoint(run_dir: str | os.PathLike) -> Optional[Path]:
    """run_dir's newest checkpoint folder (transformers' naming), or None; None too when the run's state is missing
    there (a save cut short), so the run starts over rather than resume without it."""
    from transformers.trainer_utils import get_last_checkpoint

    if not Path(run_dir).is_dir():
        return None
    found = get_last_checkpoint(str(run_dir))
    return Path(found) if found is not None and (Path(found) / RUN_STATE).is_file() else None


def load_checkpoint(run_dir: str | os.PathLike) -> Optional[dict]:
    """{"path", "state", "config"} of run_dir's newest checkpoint (config: the model's, to rebuild it), or None."""
    path = last_checkpoint(run_dir)
    if path is None:
        return None
    saved = json.loads((path / RUN_STATE).read_text())
    return {"path": path, "state": saved["state"], "config": saved["config"]}


class Run:
    """One training run of `model` (see the module docstring for how a recipe uses it).

    batches(rng) -> batch: one training batch (tensors, or tuples / lists / dicts of them) from a numpy generator.
    loss(model, batch) -> scalar tensor to minimise; under several processes `model` is the DDP-wrapped model.
    evaluate(model) -> float | None: the held-out figure, stored as state[metric] (and state["best_" + metric]);
        run every eval_every_steps / eval_minutes and at the end. metric also names it in the log and the bar.
    counts(batch) -> {name: int}: counters added to the state each step ("tokens_seen" also gives tokens/s).
    state: extra fields of the run's state; a resumed run takes the checkpoint's values.
    checkpoint: what load_checkpoint(run_dir) returned, when the recipe read it already (to build the model).
    key: the settings a checkpoint must have been trained with to be resumed (kept in the state); on a mismatch
        the run starts over and says which differ. Never put a budget (max_steps, max_minutes) in it: raising
        one must resume.
    name: prefixes the log lines and labels the progress bar ("fine-tune"); log receives every line.
    self.rng: a numpy generator for the loss's own draws (saved with each checkpoint).
    """

    def __init__(
        self,
        model,
        opts: RunOptions,
        run_dir: str | os.PathLike,
        *,
        batches: Callable[[np.random.Generator], Any],
        loss: Callable[[Any, Any], Any],
        evaluate: Optional[Callable[[Any], Optional[float]]] = None,
        metric: str = "val_loss",
        counts: Optional[Callable[[Any], dict[str, int]]] = None,
        state: Optional[dict] = None,
        checkpoint: Optional[dict] = None,
        key: Optional[dict] = None,
        name: str = "",
        log: Callable[[str], None] = print,
    ):
        self.model, self.opts, self.run_dir = model, opts, Path(run_dir)
        self.batches, self.loss, self.evaluate, self.metric, self.counts = batches, loss, evaluate, metric, counts
        self.prefix = f"{name}: " if name else ""
        self.desc, self.log = name or None, log
        self.bf16 = opts.use_bf16
        self.device = next(model.parameters()).device
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.run_dir / "log.jsonl"
        self.rng = np.random.default_rng(opts.seed + 1)
        self.state: dict[str, Any] = {
            "step": 0,
            "elapsed": 0.0,
            metric: None,
            "best_" + metric: None,
            "resumes": 0,
            "finished": False,
            "commands": [],
            **(state or {}),
        }
        if key is not None:
            self.state["key"] = key
        self.checkpoint: Optional[Path] = None
        self.evaluated_at: Optional[int] = None  # the step of the last held-out evaluation (the callbacks')
        self.last_lr: Optional[float] = None
        self.pending_counts: dict[str, int] = {}  # this process's counts of the current step (the callbacks add them)
        ckpt = checkpoint if checkpoint is not None else load_checkpoint(self.run_dir)
        if ckpt is not None:
            if self._same_key(ckpt):
                self._restore(ckpt)
            else:
                for stale in self.run_dir.glob(CHECKPOINT_PREFIX + "*"):
                    shutil.rmtree(stale)
        self.state["commands"] = list(self.state["commands"]) + [opts.command or command_line()]

    @property
    def resumed(self) -> bool:
        return self.state["resumes"] > 0

    @property
    def is_main(self) -> bool:
        """Whether this is the process that writes files (the only one, or rank 0 under torchrun)."""
        return int(os.environ.get("RANK", "0")) == 0

    def _same_key(self, ckpt: dict) -> bool:
        key = self.state.get("key")
        if key is None:
            return True
        saved = ckpt["state"].get("key") or {}
        changed = sorted(k for k in key if saved.get(k) != key[k])
        if changed:
            self.log(
                f"{self.prefix}{ckpt['path']} was trained with other settings ({', '.join(changed)} differ); "
                "starting over"
            )
        return not changed

    def _restore(self, ckpt: dict) -> None:
        """The checkpoint's state, loss generator and weights (so the model is the checkpoint's before fit())."""
        saved = dict(ckpt["state"])
        self.rng.bit_generator.state = saved.pop("loss_rng")
        self.state.update(saved)
        self.state["resumes"] += 1
        self.checkpoint = Path(ckpt["path"])
        self._hf_trainer()._load_from_checkpoint(str(self.checkpoint))
        tokens = f", {self.state['tokens_seen']:,} tokens" if "tokens_seen" in self.state else ""
        self.log(
            f"{self.prefix}resumed from {self.checkpoint} at step {self.state['step']} "
            f"({self.state['elapsed'] / 60:.1f} min{tokens})"
        )

    # ---- budgets

    def budget_s(self) -> Optional[float]:
        return self.opts.max_minutes * 60.0 if self.opts.max_minutes else None

    def progress(self, step: Optional[int] = None) -> float:
        """Fraction of the run done: the larger of the step fraction (of `step` steps, default the state's) and
        the time fraction."""
        budget, ps = self.budget_s(), []
        if self.opts.max_steps:
            ps.append((self.state["step"] if step is None else step) / self.opts.max_steps)
        if budget:
            ps.append(self.state["elapsed"] / budget)
        return max(ps)

    def done(self) -> bool:
        budget = self.budget_s()
        return (self.opts.max_steps is not None and self.state["step"] >= self.opts.max_steps) or (
            budget is not None and self.state["elapsed"] >= budget
        )

    def run_evaluation(self) -> Optional[float]:
        """The held-out figure now (state[metric], and its best so far), or None without an evaluate()."""
        if self.evaluate is None:
            return None
        v = self.evaluate(self.model)
        self.state[self.metric] = v
        best = self.state["best_" + self.metric]
        if v is not None and (best is None or v < best):
            self.state["best_" + self.metric] = v
        return v

    def save_state(self, checkpoint: Path) -> None:
        """Write the run's state next to a checkpoint transformers wrote."""
        saved = {**self.state, "loss_rng": self.rng.bit_generator.state}
        (checkpoint / RUN_STATE).write_text(
            json.dumps({"state": saved, "config": model_config(self.model)}, indent=1, default=str) + "\n"
        )
        self.checkpoint = checkpoint

    def write_log(self, rec: dict) -> None:
        if self.is_main:
            with open(self.log_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")

    def metric_text(self, value: Optional[float]) -> str:
        """The held-out figure's part of a log line; nothing for a recipe without a held-out evaluation."""
        if self.evaluate is None:
            return ""
        return f" | {self.metric.replace('_', ' ')} {'-' if value is None else format(value, '.4f')}"

    # ---- transformers

    def _hf_trainer(self):
        """A transformers Trainer for the next fit() (one per call: each resumes from the last checkpoint)."""
        from .hf import make_trainer

        return make_trainer(self)

    def fit(self, stop_after_steps: Optional[int] = None, *, until: Optional[float] = None) -> dict:
        """Train until a budget is reached (then evaluate, checkpoint, return the state with "stopped": False)
        or until interrupted by SIGINT/SIGTERM or after `stop_after_steps` steps of this call (a test hook):
        then checkpoint and return the state with "stopped": True.

        until: pause once progress() reaches this fraction of the run (checkpoint, no final evaluation; the
        state has "paused": True), for a recipe that changes ``self.loss`` part-way through one schedule; a
        rerun pauses there again at once, and the next fit() call goes on to the end.
        """
        from .callbacks import Budget

        if until is not None and self.progress() >= until and not self.done():
            return {**self.state, "stopped": False, "paused": True}
        if self.done():  # a finished run rerun (or a budget already spent): no further step
            return self._finish()
        budget = Budget(self, stop_after_steps, until)
        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not in the main thread
                old_handlers[sig] = signal.signal(sig, budget.on_signal)
        try:
            trainer = self._hf_trainer()
            trainer.add_callback(budget)
            trainer.train(resume_from_checkpoint=str(self.checkpoint) if self.checkpoint else None)
        finally:
            for sig, h in old_handlers.items():
                with contextlib.suppress(Exception):
                    signal.signal(sig, h)
        if budget.reason is not None and not self.done():
            self.log(
                f"{self.prefix}stopped ({budget.reason}) at step {self.state['step']}; checkpoint saved to "
                f"{self.checkpoint}; run the same command again to resume"
            )
            return {**self.state, "stopped": True, "paused": False}
        if until is not None and not self.done():
            return {**self.state, "stopped": False, "paused": True}
        return self._report_done()

    def _finish(self) -> dict:
        """The end of a run whose budget was spent before this fit(): evaluate again and rewrite its state."""
        self.run_evaluation()
        self.state["finished"] = True
        if self.checkpoint is not None and self.is_main:
            self.save_state(self.checkpoint)
        return self._report_done()

    def _report_done(self) -> dict:
        """The final JSONL record and log line of a finished run; its state, not stopped."""
        state, val = self.state, self.state[self.metric] if self.evaluate is not None else None
        final = {
            "step": state["step"],
            "elapsed": round(state["elapsed"], 2),
            "train_loss": None,
            self.metric: None if val is None else round(val, 5),
            "lr": self.last_lr,
            "final": True,
        }
        if "tokens_seen" in state:
            final["tokens_seen"] = state["tokens_seen"]
        self.write_log(final)
        tokens = f" | {state['tokens_seen']:,} tokens" if "tokens_seen" in state else ""
        if self.is_main:
            self.log(
                f"{self.prefix}done: step {state['step']}{self.metric_text(val)}{tokens} | "
                f"{state['elapsed'] / 60:.1f} min"
            )
        return {**state, "stopped": False, "paused": False}
