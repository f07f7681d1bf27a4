"""The one training loop every recipe (`train lm`, `train align`, `train early-exit`, ...) runs on.

A recipe decides *what* to learn; the trainer owns *how a run behaves*: AdamW + warmup/cosine schedule over
``max(step / max_steps, elapsed / budget)`` (so a wall-clock budget still gets a full decay), step and time
budgets, gradient clipping, a JSONL log and a progress bar, periodic held-out evaluation, checkpoints every
``checkpoint_minutes`` (model, optimizer, schedule, RNG states, elapsed time, the recipe's own state fields),
SIGINT/SIGTERM handling (checkpoint, then stop) and automatic resume when the same command is run again. A
resumed run takes exactly the steps an uninterrupted one would have taken: batches are drawn from the trainer's
own numpy generator, which is checkpointed.

Writing a recipe::

    @dataclass
    class MyOptions(TrainerOptions):        # the run options (lr, budgets, threads, ...) come with it
        data: str
        def validate(self):
            self.validate_run()              # budgets, lr, threads, log cadence: one set of messages
            ...                              # the recipe's own inputs

    seed_everything(opts.seed)               # before the model is built: its init uses torch's RNG
    model = ...                              # float32, train mode
    trainer = Trainer(model, opts, run_dir,
                      batches=lambda rng: draw(rng),            # one batch from the trainer's generator
                      loss=lambda model, batch: scalar_loss,    # under losses.autocast(trainer.bf16)
                      evaluate=lambda model: held_out_loss,     # optional; stored as state[metric]
                      counts=lambda batch: {"tokens_seen": n},  # optional per-step counters in state
                      state={"my_field": None},                 # extra fields, saved in checkpoints
                      key={"data": sha, **opts.optimizer_key()})  # optional: what a checkpoint must
                                                                # match to be resumed (never a budget)
    result = trainer.fit()                   # resumes from run_dir/checkpoint if there is one
    if result["stopped"]: ...                # interrupted: checkpoint written, nothing to export
    else: export(model)

The recipe may read and write ``trainer.state`` between construction and ``fit()`` (figures measured before
training) and after it: everything in it is checkpointed.
A recipe whose objective changes part-way through one schedule calls ``fit(until=fraction)``, then sets
``trainer.loss`` and calls ``fit()`` again (`train lm --early-exit-layer`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

CKPT_NAME = "checkpoint"
# bf16 autocast (fp32 master weights and optimizer): a CPU with bf16 instructions trains faster with it than in
# fp32 (`draftverify train bench` compares the two on the machine at hand); --no-bf16 turns it off
DEFAULT_BF16 = True


class TrainError(RuntimeError):
    """User-facing training error (bad arguments, missing inputs, a diverging run...)."""


@dataclass(kw_only=True)
class TrainerOptions:
    """Optimizer, schedule, budgets and run settings every recipe shares. Keyword-only, so a recipe's options
    (a subclass) can add positional fields and redeclare one of these to change its default."""

    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: Optional[int] = None
    max_minutes: Optional[float] = None
    threads: Optional[int] = None
    bf16: Optional[bool] = None  # None -> DEFAULT_BF16
    batch_size: int = 8
    seed: int = 1234
    eval_every_steps: Optional[int] = None  # held-out evaluation every N steps ...
    eval_minutes: Optional[float] = None  # ... or every N minutes (eval_every_steps wins); always at the end
    checkpoint_minutes: float = 10.0
    log_every: int = 10
    progress: Optional[bool] = None  # None -> tqdm bar iff stderr is a tty
    command: Optional[str] = None  # recorded in the model card
    device: str = "cpu"  # cpu, cuda, cuda:N or mps: the models and every batch live there
    dtype: str = "auto"  # a frozen target's precision (devices.resolve_dtype); trained weights stay float32

    def validate_run(self) -> None:
        """The checks of these fields, with the same messages for every recipe (raise TrainError)."""
        if self.max_steps is None and self.max_minutes is None:
            raise TrainError("give --max-steps and/or --max-minutes")
        for name in (
            "max_steps",
            "max_minutes",
            "lr",
            "batch_size",
            "log_every",
            "threads",
            "eval_every_steps",
            "eval_minutes",
            "checkpoint_minutes",
        ):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive, got {v}")
        if self.warmup_steps < 0:
            raise TrainError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise TrainError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip <= 0:
            raise TrainError(f"--grad-clip must be positive, got {self.grad_clip}")
        self.torch_device()
        self.frozen_dtype()

    def torch_device(self):
        """The checked torch.device of --device (TrainError naming the devices there are)."""
        from ..devices import resolve_device
        from ..errors import DraftVerifyError

        try:
            return resolve_device(self.device)
        except DraftVerifyError as e:
            raise TrainError(str(e)) from None

    def frozen_dtype(self) -> str:
        """The dtype name a frozen model (the target a drafter learns from) loads at on this device."""
        from ..devices import resolve_dtype
        from ..errors import DraftVerifyError

        try:
            return resolve_dtype(self.dtype, self.torch_device())
        except DraftVerifyError as e:
            raise TrainError(str(e)) from None

    @property
    def use_progress(self) -> bool:
        """A tqdm bar: as asked, else iff stderr is a terminal."""
        return self.progress if self.progress is not None else sys.stderr.isatty()

    @property
    def use_bf16(self) -> bool:
        return DEFAULT_BF16 if self.bf16 is None else bool(self.bf16)

    def optimizer_key(self) -> dict:
        """The optimizer and schedule settings, for a recipe's checkpoint key (a resumed run must keep them)."""
        return {
            "lr": self.lr,
            "warmup_steps": self.warmup_steps,
            "min_lr_ratio": self.min_lr_ratio,
            "weight_decay": self.weight_decay,
            "betas": [self.beta1, self.beta2],
            "grad_clip": self.grad_clip,
        }


# --------------------------------------------------------------------------- building blocks


def make_optimizer(model, lr: float, weight_decay: float, beta1: float, beta2: float):
    """AdamW with weight decay on the matrices (dim >= 2) only, not on norm weights / biases."""
    import torch

    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(beta1, beta2),
        eps=1e-8,
        fused=False,
    )


class WarmupCosine:
    """LR = base * warmup(step) then cosine over progress in [0, 1] down to min_ratio*base."""

    def __init__(self, base_lr: float, warmup_steps: int, min_ratio: float):
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.min_ratio = min_ratio
        self.last_lr = 0.0
        self.last_progress = 0.0

    def lr(self, step: int, progress: float) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            lr = self.base_lr * (step + 1) / self.warmup_steps
        else:
            p = min(max(progress, 0.0), 1.0)
            lr = self.base_lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
        self.last_lr, self.last_progress = lr, progress
        return lr

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, sd: dict) -> None:
        self.__dict__.update(sd)


def to_device(batch: Any, device) -> Any:
    """A batch (a tensor, or tuples / lists / dicts of them and of other values) with its tensors on device."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def set_threads(threads: Optional[int]) -> None:
    """torch's intra-op threads (one inter-op thread, so --threads N uses N cores); also keeps the Rust
    tokenizer from spawning a pool on the other cores when training on one thread."""
    import torch

    if threads == 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)


def seed_everything(seed: int) -> None:
    """Seed torch and Python's RNG before the model is built (its initialisation draws from torch's)."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or "unknown CPU"


def machine_name(device) -> str:
    """The CPU's name and, when the models ran elsewhere, the device (a GPU by its name): what a card records."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{cpu_name()}; models on {device} ({torch.cuda.get_device_name(device)})"
    return cpu_name() if device.type == "cpu" else f"{cpu_name()}; models on {device}"


def command_line() -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


# --------------------------------------------------------------------------- checkpoint


def model_config(model) -> Optional[dict]:
    """The model's config as a dict (a Hugging Face config, or a drafter's config dataclass), or None."""
    config = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None


def save_checkpoint(
    run_dir: Path, model, optimizer, sched: WarmupCosine, state: dict, np_rng: np.random.Generator
) -> Path:
    """Write run_dir/checkpoint atomically (a crash leaves the previous one, or checkpoint.old, readable)."""
    import torch

    run_dir = Path(run_dir)
    ckpt, tmp, old = (run_dir / (CKPT_NAME + s) for s in ("", ".tmp", ".old"))
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy_batch": np_rng.bit_generator.state,
                "python": random.getstate(),
            },
            "state": state,
            "config": model_config(model),
        },
        tmp / "state.pt",
    )
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
    if ckpt.exists():
        if old.exists():
            shutil.rmtree(old)
        ckpt.rename(old)
    tmp.rename(ckpt)
    if old.exists():
        shutil.rmtree(old)
    return ckpt


def load_checkpoint(run_dir: Path) -> Optional[dict]:
    """The checkpoint dict of run_dir (or of checkpoint.old after a crash between renames), or None."""
    import torch

    for name in (CKPT_NAME, CKPT_NAME + ".old"):
        f = Path(run_dir) / name / "state.pt"
        if f.is_file():
            return torch.load(f, map_location="cpu", weights_only=False)
    return None


# --------------------------------------------------------------------------- the loop


class Trainer:
    """One training run of `model` (see the module docstring for how a recipe uses it).

    batches(rng) -> batch: draws one training batch from the trainer's numpy generator (checkpointed).
    loss(model, batch) -> scalar tensor to minimise.
    evaluate(model) -> float | None: the held-out figure, stored as state[metric] (and state["best_" + metric]);
        run every eval_every_steps / eval_minutes and at the end. metric also names it in the log and the bar.
    counts(batch) -> {name: int}: counters added to the state each step ("tokens_seen" also gives tokens/s).
    state: extra fields of the run's state; a resumed run takes the checkpoint's values.
    checkpoint: a checkpoint the recipe already read with load_checkpoint(run_dir) (to build the model from its
        config); by default the trainer reads run_dir's itself.
    key: the settings a checkpoint must have been trained with to be resumed (kept in the state); on a mismatch
        the run starts over and says which differ. Never put a budget (max_steps, max_minutes) in it: raising
        one must resume.
    name: prefixes the log lines and labels the progress bar ("fine-tune"); log receives every line.
    """

    def __init__(
        self,
        model,
        opts: TrainerOptions,
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
        self.device = next(model.parameters()).device  # where each batch goes before the loss reads it
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.run_dir / "log.jsonl"
        self.rng = np.random.default_rng(opts.seed)
        self.optimizer = make_optimizer(model, opts.lr, opts.weight_decay, opts.beta1, opts.beta2)
        self.sched = WarmupCosine(opts.lr, opts.warmup_steps, opts.min_lr_ratio)
        self.state = {
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
        ckpt = checkpoint if checkpoint is not None else load_checkpoint(self.run_dir)
        if ckpt is not None and self._same_key(ckpt):
            self._restore(ckpt)
        self.state["commands"] = list(self.state["commands"]) + [opts.command or command_line()]

    @property
    def resumed(self) -> bool:
        return self.state["resumes"] > 0

    def _same_key(self, ckpt: dict) -> bool:
        key = self.state.get("key")
        if key is None:
            return True
        saved = ckpt["state"].get("key") or {}
        changed = sorted(k for k in key if saved.get(k) != key[k])
        if changed:
            self.log(
                f"{self.prefix}{self.run_dir / CKPT_NAME} was trained with other settings "
                f"({', '.join(changed)} differ); starting over"
            )
        return not changed

    def _restore(self, ckpt: dict) -> None:
        import torch

        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        # an explicit new --lr / --warmup-steps / --min-lr-ratio on resume wins over the saved one
        self.sched.base_lr, self.sched.warmup_steps = self.opts.lr, self.opts.warmup_steps
        self.sched.min_ratio = self.opts.min_lr_ratio
        self.state.update(ckpt["state"])
        self.state["resumes"] += 1
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"])
        self.rng.bit_generator.state = rng["numpy_batch"]
        random.setstate(rng["python"])
        tokens = f", {self.state['tokens_seen']:,} tokens" if "tokens_seen" in self.state else ""
        self.log(
            f"{self.prefix}resumed from {self.run_dir / CKPT_NAME} at step {self.state['step']} "
            f"({self.state['elapsed'] / 60:.1f} min{tokens})"
        )

    # ---- budgets

    def _budget_s(self) -> Optional[float]:
        return self.opts.max_minutes * 60.0 if self.opts.max_minutes else None

    def progress(self) -> float:
        """Fraction of the run done: the larger of the step and the time fractions."""
        budget, ps = self._budget_s(), []
        if self.opts.max_steps:
            ps.append(self.state["step"] / self.opts.max_steps)
        if budget:
            ps.append(self.state["elapsed"] / budget)
        return max(ps)

    def done(self) -> bool:
        budget = self._budget_s()
        return (self.opts.max_steps is not None and self.state["step"] >= self.opts.max_steps) or (
            budget is not None and self.state["elapsed"] >= budget
        )

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.model, self.optimizer, self.sched, self.state, self.rng)

    def _evaluate(self) -> Optional[float]:
        if self.evaluate is None:
            return None
        v = self.evaluate(self.model)
        self.state[self.metric] = v
        best = self.state["best_" + self.metric]
        if v is not None and (best is None or v < best):
            self.state["best_" + self.metric] = v
        return v

    def _eval_due(self, last_eval_elapsed: float) -> bool:
        o = self.opts
        if o.eval_every_steps:
            return self.state["step"] % o.eval_every_steps == 0
        return o.eval_minutes is not None and self.state["elapsed"] - last_eval_elapsed >= o.eval_minutes * 60

    def _write(self, rec: dict) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    # ---- the loop

    def fit(self, stop_after_steps: Optional[int] = None, *, until: Optional[float] = None) -> dict:
        """Train until a budget is reached (then evaluate, checkpoint, return the state with "stopped": False)
        or until interrupted by SIGINT/SIGTERM or after `stop_after_steps` steps of this call (a test hook):
        then checkpoint and return the state with "stopped": True.

        until: pause once progress() reaches this fraction of the run (checkpoint, no final evaluation; the
        state has "paused": True), for a recipe that changes ``self.loss`` part-way through one schedule; a
        rerun pauses there again at once, and the next fit() call goes on to the end.
        """
        import torch

        opts, state, model = self.opts, self.state, self.model
        model.train()
        stop: dict[str, Any] = {"reason": None}

        def on_signal(signum, frame):
            stop["reason"] = signal.Signals(signum).name

        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not in the main thread
                old_handlers[sig] = signal.signal(sig, on_signal)
        use_bar = opts.use_progress
        bar = None
        if use_bar and not self.done():
            from tqdm.auto import tqdm

            bar = tqdm(total=opts.max_steps, initial=state["step"], unit="step", desc=self.desc, dynamic_ncols=True)
        seg_start, base_elapsed = time.time(), state["elapsed"]
        last_ckpt = last_eval = state["elapsed"]
        steps_this_run = 0
        win_loss, win_n, win_t0, win_tok, tok_s = 0.0, 0, time.time(), 0, 0.0
        try:
            while not self.done() and stop["reason"] is None and (until is None or self.progress() < until):
                lr = self.sched.lr(state["step"], self.progress())
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                batch = to_device(self.batches(self.rng), self.device)
                loss = self.loss(model, batch)
                if not torch.isfinite(loss):
                    raise TrainError(f"loss became {loss.item()} at step {state['step']}; try a lower --lr")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
                self.optimizer.step()

                state["step"] += 1
                steps_this_run += 1
                counts = self.counts(batch) if self.counts else {}
                for k, n in counts.items():
                    state[k] = state.get(k, 0) + n
                win_tok += counts.get("tokens_seen", 0)
                state["elapsed"] = base_elapsed + (time.time() - seg_start)
                win_loss, win_n = win_loss + loss.item(), win_n + 1

                val = None
                if self.evaluate is not None and self._eval_due(last_eval):
                    val = self._evaluate()
                    last_eval = state["elapsed"]
                if state["step"] % opts.log_every == 0 or val is not None:
                    dt = time.time() - win_t0
                    tok_s = win_tok / dt if dt > 0 else 0.0
                    self._log_step(lr, win_loss / max(win_n, 1), val, tok_s, float(gnorm), bar is None)
                    win_loss, win_n, win_t0, win_tok = 0.0, 0, time.time(), 0
                if bar is not None:
                    bar.update(1)
                    cur = state[self.metric]
                    shown = {} if self.evaluate is None else {self.metric: "-" if cur is None else f"{cur:.3f}"}
                    bar.set_postfix(loss=f"{loss.item():.3f}", **shown, min=f"{state['elapsed'] / 60:.1f}")
                if state["elapsed"] - last_ckpt >= opts.checkpoint_minutes * 60:
                    self.save()
                    last_ckpt = state["elapsed"]
                if stop_after_steps is not None and steps_this_run >= stop_after_steps:
                    stop["reason"] = "stop_after_steps"
        finally:
            if bar is not None:
                bar.close()
            for sig, h in old_handlers.items():
                with contextlib.suppress(Exception):
                    signal.signal(sig, h)

        if stop["reason"] is not None and not self.done():
            self.save()
            self.log(
                f"{self.prefix}stopped ({stop['reason']}) at step {state['step']}; checkpoint saved to "
                f"{self.run_dir / CKPT_NAME}; run the same command again to resume"
            )
            return {**state, "stopped": True, "paused": False}
        if until is not None and not self.done():
            if steps_this_run:
                self.save()
            return {**state, "stopped": False, "paused": True}
        val = self._evaluate()
        state["finished"] = True
        final = {
            "step": state["step"],
            "elapsed": round(state["elapsed"], 2),
            "train_loss": None,
            self.metric: None if val is None else round(val, 5),
            "lr": self.sched.last_lr,
            "final": True,
        }
        if "tokens_seen" in state:
            final["tokens_seen"] = state["tokens_seen"]
        self._write(final)
        self.save()
        tokens = f" | {state['tokens_seen']:,} tokens" if "tokens_seen" in state else ""
        self.log(
            f"{self.prefix}done: step {state['step']}{self._metric_text(val)}{tokens} | {state['elapsed'] / 60:.1f} min"
        )
        return {**state, "stopped": False, "paused": False}

    def _log_step(
        self, lr: float, train_loss: float, val: Optional[float], tok_s: float, gnorm: float, echo: bool
    ) -> None:
        state = self.state
        rec = {
            "step": state["step"],
            "elapsed": round(state["elapsed"], 2),
            "train_loss": round(train_loss, 5),
            self.metric: None if val is None else round(val, 5),
            "lr": lr,
            "grad_norm": round(gnorm, 4),
        }
        if "tokens_seen" in state:
            rec.update(tokens_seen=state["tokens_seen"], tokens_per_s=round(tok_s, 1))
        self._write(rec)
        if echo:
            speed = f" | {tok_s:,.0f} tok/s | {state['tokens_seen']:,} tok" if "tokens_seen" in state else ""
            metric = self._metric_text(state[self.metric])
            self.log(
                f"{self.prefix}step {state['step']:>6} | loss {train_loss:.4f}{metric} | lr {lr:.2e}{speed} | "
                f"{state['elapsed'] / 60:.1f} min"
            )

    def _metric_text(self, value: Optional[float]) -> str:
        """The held-out figure's part of a log line; nothing for a recipe without a held-out evaluation."""
        if self.evaluate is None:
            return ""
        return f" | {self.metric.replace('_', ' ')} {'-' if value is None else format(value, '.4f')}"
