"""What every recipe's run is set with and runs on: the run options they share (RunOptions: optimizer, schedule,
budgets, device), the error a recipe raises for the user (TrainError), and the small helpers of a run (threads,
seeds, the machine's name, a batch moved to a device; the CPU's name and the command line are bench/environment's).
The run itself is train/runner.py's, on transformers' Trainer. No torch import at module level: the CLI's help
builds without it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Optional

from ..bench.environment import cpu_model
from .shared_flags import shared, shared_flags

# bf16 autocast (fp32 master weights and optimizer): a CPU with bf16 instructions trains faster with it than in
# fp32 (`draftverify train bench` compares the two on the machine at hand); --no-bf16 turns it off
DEFAULT_BF16 = True


class TrainError(RuntimeError):
    """User-facing training error (bad arguments, missing inputs, a diverging run...)."""


@dataclass(kw_only=True)
@shared_flags
class RunOptions:
    """Optimizer, schedule, budgets and run settings every recipe shares, each its flag (train/shared_flags.py).
    Keyword-only, so a recipe's options (a subclass) can add positional fields and redeclare one of these with
    shared(its default) to change its default."""

    lr: float = shared(1e-3)
    min_lr_ratio: float = shared(0.1)
    warmup_steps: int = shared(100)
    weight_decay: float = shared(0.1)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = shared(1.0)
    max_steps: Optional[int] = shared(None)
    max_minutes: Optional[float] = shared(None)
    threads: Optional[int] = shared(None)
    bf16: Optional[bool] = shared(None)  # None -> DEFAULT_BF16
    batch_size: int = shared(8)
    seed: int = shared(1234)
    eval_every_steps: Optional[int] = shared(None)  # held-out evaluation every N steps ...
    eval_minutes: Optional[float] = shared(None)  # ... or every N minutes (eval_every_steps wins); always at the end
    checkpoint_minutes: float = shared(10.0)
    log_every: int = shared(10)
    progress: Optional[bool] = shared(None)  # None -> tqdm bar iff stderr is a tty
    command: Optional[str] = None  # recorded in the model card
    device: str = shared("cpu")  # cpu, cuda, cuda:N or mps: the models and every batch live there
    dtype: str = shared("auto")  # a frozen target's precision (devices.resolve_dtype); trained weights stay float32

    def validate_run(self) -> None:
        """The checks of these fields, with the same messages for every recipe (raise TrainError); and that every
        required flag of the recipe's (declared with default ``...``) was given."""
        from ..options.declare import declared

        for f, opt in declared(type(self)):
            if getattr(self, f.name) is ...:
                raise TrainError(f"give {opt.flag}")
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
        """The checked torch.device of --device (TrainError naming the devices there are); under torchrun or
        accelerate launch, plain ``cuda`` is this process's GPU (LOCAL_RANK)."""
        from ..devices import resolve_device
        from ..errors import DraftVerifyError

        try:
            device = resolve_device(self.device)
        except DraftVerifyError as e:
            raise TrainError(str(e)) from None
        if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
            import torch

            return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return device

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

    def optimizer_settings(self) -> dict:
        """AdamW's and the schedule's settings, as a training report records them (betas a tuple)."""
        return {
            "lr": self.lr,
            "betas": (self.beta1, self.beta2),
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "min_lr_ratio": self.min_lr_ratio,
            "grad_clip": self.grad_clip,
        }

    def optimizer_key(self) -> dict:
        """The optimizer and schedule settings, for a recipe's checkpoint key (a resumed run must keep them); betas
        a list, as the key saved with a checkpoint reads back from JSON."""
        return {**self.optimizer_settings(), "betas": [self.beta1, self.beta2]}


# --------------------------------------------------------------------------- helpers


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


def machine_name(device) -> str:
    """The CPU's name and, when the models ran elsewhere, the device (a GPU by its name): what a card records."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{cpu_model()}; models on {device} ({torch.cuda.get_device_name(device)})"
    return cpu_model() if device.type == "cpu" else f"{cpu_model()}; models on {device}"


def model_config(model) -> Optional[dict]:
    """The model's config as a dict (a Hugging Face config, or a drafter's config dataclass), or None."""
    config = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None


# what the run (runner.py), its Trainer (hf.py) and its callbacks (callbacks.py) share
CHECKPOINT_PREFIX = "checkpoint-"  # transformers' checkpoint folders: checkpoint-<step>
UNBOUNDED_STEPS = 10**12  # transformers' step bound for a run limited by its wall-clock budget only


def check_finite(loss, step: int) -> None:
    """A loss that is not finite stops the run with a TrainError naming the step."""
    import torch

    if not torch.isfinite(loss):
        raise TrainError(f"loss became {loss.item()} at step {step}; try a lower --lr")
