"""A recipe's run (train/runner.py) as a transformers ``Trainer``: the arguments that carry the run options over, the
recipe's batches as the Trainer's dataset, its loss as ``compute_loss``, and the learning-rate schedule.

The schedule is linear warm-up, then a cosine down to ``min_lr_ratio`` of the peak over the run's progress, the
larger of its step and wall-clock fractions: transformers' schedules are functions of the step count alone, so a run
bounded by ``--max-minutes`` would never decay; this one does, and equals transformers' ``cosine_with_min_lr`` when
only ``--max-steps`` bounds the run (up to the warm-up's first step).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable

import numpy as np

from .settings import UNBOUNDED_STEPS, TrainError, check_finite

# a run's `run` arguments are train/runner.py's Run, not imported here: runner imports this module


def batch_stream(batches: Callable[[np.random.Generator], Any], seed: int):
    """An endless torch IterableDataset of a recipe's batches, each drawn by batches(rng) from a numpy generator
    seeded with `seed` anew at each pass, so a resumed run that skips the batches already trained on sees the same
    ones after them. Each item is {"batch": batch}: transformers moves the tensors in it to the device. Under several
    processes accelerate gives each process every n-th batch of the stream."""
    import torch

    class BatchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            rng = np.random.default_rng(seed)
            while True:
                yield {"batch": batches(rng)}

    return BatchStream()


def lr_factor(run, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of the peak (see the module docstring)."""
    o = run.opts
    if o.warmup_steps > 0 and step < o.warmup_steps:
        return (step + 1) / o.warmup_steps
    p = min(max(run.progress(step), 0.0), 1.0)
    return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def training_arguments(run):
    """transformers TrainingArguments carrying the run options: the device, bf16, AdamW, clipping, seed and the
    logging cadence; saving and stopping are the callbacks' (train/callbacks.py)."""
    import torch
    from transformers import TrainingArguments

    o, device = run.opts, run.device
    if device.type == "cuda" and device.index is not None and "LOCAL_RANK" not in os.environ:
        torch.cuda.set_device(device)  # transformers trains on the current CUDA device
    try:
        return TrainingArguments(
            output_dir=str(run.run_dir),
            max_steps=o.max_steps or UNBOUNDED_STEPS,
            per_device_train_batch_size=1,  # one item of the stream is one recipe batch
            learning_rate=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.beta1,
            adam_beta2=o.beta2,
            adam_epsilon=1e-8,
            optim="adamw_torch",
            max_grad_norm=o.grad_clip,
            bf16=run.bf16,
            use_cpu=device.type == "cpu",
            seed=o.seed,
            logging_strategy="steps",
            logging_steps=o.log_every,
            save_strategy="steps",
            save_steps=UNBOUNDED_STEPS,  # checkpoints come every checkpoint_minutes, from the Budget callback
            save_total_limit=1,
            report_to="none",
            disable_tqdm=True,
            dataloader_pin_memory=False,
            remove_unused_columns=False,
            accelerator_config={"dispatch_batches": False},
        )
    except ValueError as e:  # e.g. bf16 asked on a device without it
        raise TrainError(f"{e} (try --no-bf16)") from None


@contextlib.contextmanager
def _own_config_hidden(model):
    """The model without its `config` attribute while transformers' Trainer is built, when that is a drafter's own
    (frozen) config dataclass rather than a transformers config: the Trainer sets ``config.use_cache`` on any."""
    from transformers import PretrainedConfig

    config = model.__dict__.get("config")
    if config is None or isinstance(config, PretrainedConfig):
        yield
        return
    del model.__dict__["config"]
    try:
        yield
    finally:
        model.__dict__["config"] = config


def make_trainer(run):
    """A transformers Trainer of `run`: its model, batches, loss and schedule, the progress line as a callback."""
    import torch
    from transformers import PrinterCallback, Trainer
    from transformers.utils import logging

    from .callbacks import ProgressLine

    logging.disable_progress_bar()  # a bar per checkpoint written; the run's own line says where it is

    class RecipeTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            batch = inputs["batch"]
            loss = run.loss(model, batch)
            check_finite(loss, run.state["step"])
            for k, n in (run.counts(batch) if run.counts else {}).items():
                run.pending_counts[k] = run.pending_counts.get(k, 0) + n  # summed over processes at the step's end
            return loss

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda step: lr_factor(run, step)
                )
            return self.lr_scheduler

    with _own_config_hidden(run.model):
        trainer = RecipeTrainer(
            model=run.model,
            args=training_arguments(run),
            train_dataset=batch_stream(run.batches, run.opts.seed),
            data_collator=lambda items: items[0],
        )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(ProgressLine(run))
    return trainer
