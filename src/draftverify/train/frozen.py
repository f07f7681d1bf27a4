"""What the recipes that learn on a frozen target share (`train heads`, `train bita`, `train nat` on a decoder-only
target): the checks of the target, tokenizer and manifest they name, and loading the target with its weights frozen,
so each recipe says only what it learns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .settings import RunOptions, TrainError, machine_name, set_threads
from .shared_flags import BF16_OPT_IN, OWN_DATA, recipe_options, shared, shared_flags


class FrozenTarget:
    """Mixin of a frozen-target recipe's options (a RunOptions dataclass with target, tokenizer, manifest,
    min_prompt_tokens and max_prompt_tokens fields)."""

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer or self.target

    def validate_frozen(self, positive: tuple[str, ...]) -> None:
        """The run options, the prompt lengths, the `positive` fields (each >= 1) and the inputs (raise TrainError)."""
        self.validate_run()
        for name in ("min_prompt_tokens", *positive):
            if getattr(self, name) < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_tokens < self.min_prompt_tokens:
            raise TrainError("--max-prompt-tokens must be >= --min-prompt-tokens")
        data_seed = getattr(self, "data_seed", None)
        if data_seed is not None and (isinstance(data_seed, bool) or not isinstance(data_seed, int) or data_seed < 0):
            raise TrainError(f"--data-seed must be an integer >= 0, got {data_seed!r}")
        check_inputs(self)


@dataclass(kw_only=True)
@shared_flags
class FrozenRunOptions(RunOptions):
    """The run defaults of the recipes that train a small piece on a frozen target (`train heads`, `train eagle3`,
    `train bita`): float32 unless bf16 is asked for, a short warm-up, no weight decay."""

    bf16: Optional[bool] = shared(False, BF16_OPT_IN)
    warmup_steps: int = shared(20)
    weight_decay: float = shared(0.0)


@recipe_options
class CodeTarget:
    """Options mixin (with flags) of the recipes that learn on the code zoo's target from corpus prompts (`train
    heads`, `train eagle3`, `train bita`): the target, where the prompts come from (the corpus manifest, or your
    own text) and the tokenizer."""

    target: str = shared("zoo/code/target")
    manifest: str = shared("zoo/code/manifest.json")
    data: Optional[str] = shared(None, OWN_DATA)  # read as the manifest (the command does)
    tokenizer: Optional[str] = shared(None)  # default: the target's directory


@recipe_options
class GreedyPrompts:
    """Options mixin (with flags) of the recipes that learn a frozen target's greedy continuations of corpus prompts
    from its features (`train heads`, `train eagle3`): how many prompts, how long, how many tokens each."""

    num_prompts: int = shared(400)
    eval_prompts: int = shared(48)
    min_prompt_tokens: int = shared(32)
    max_prompt_tokens: int = shared(128)
    new_tokens: int = shared(64)
    generate_batch: int = shared(32)  # prompts per batched generate call (equal-length groups within it)
    data_seed: Optional[int] = shared(None)  # None: --seed draws the prompts too

    @property
    def prompt_seed(self) -> int:
        """The seed the training prompts are drawn with (the held-out ones: this + 1): --data-seed, else --seed."""
        return self.seed if self.data_seed is None else self.data_seed  # type: ignore[attr-defined]


@recipe_options
class GreedyFeaturesOptions(FrozenTarget, CodeTarget, GreedyPrompts, FrozenRunOptions):
    """The options every recipe that learns from a frozen code target's features on its own greedy continuations
    takes (`train heads`, `train eagle3`): each adds what it trains."""


def check_inputs(opts) -> None:
    """opts.target, opts.tokenizer_dir and opts.manifest exist (raise TrainError naming the fix)."""
    if not (Path(opts.target) / "config.json").is_file():
        raise TrainError(f"--target {opts.target}: no config.json (expected an exported Hugging Face model directory)")
    if not (Path(opts.tokenizer_dir) / "tokenizer.json").is_file():
        raise TrainError(f"no tokenizer.json in {opts.tokenizer_dir}; pass --tokenizer DIR")
    if not Path(opts.manifest).exists():
        raise TrainError(
            f"manifest {opts.manifest} not found (run `draftverify train corpus` or "
            "`draftverify train tokenizer` first)"
        )


def fit_measured(
    run, accuracy: Callable[[], list[float]], label: Callable[[int], str], log: Callable[[str], None]
) -> dict:
    """run.fit() between two held-out measurements: accuracy() of the model as initialised (kept in the run's
    state, so a resumed run reports the same "before") and after training; label(i) names figure i in the log.
    Returns fit()'s state with "before" and, unless the run stopped, "after"."""
    if run.state.get("before") is None:
        run.state["before"] = accuracy()

    def show(figures: list[float]) -> str:
        return ", ".join(f"{label(i)} {a:.3f}" for i, a in enumerate(figures))

    log("held-out top-1 accuracy before: " + show(run.state["before"]))
    state = run.fit()
    if not state["stopped"]:
        run.model.eval()
        state["after"] = accuracy()
        log("held-out top-1 accuracy after: " + show(state["after"]))
    return state


def fit_facts(opts, state: dict, measure: str) -> dict:
    """What a frozen-target recipe's report says of its fit_measured() run, in the report's order: the steps, batch
    size, peak learning rate, warm-up and seed, and the held-out `measure` before and after training."""
    return {
        "steps": state["step"],
        "batch_size": opts.batch_size,
        "lr": opts.lr,
        "warmup_steps": opts.warmup_steps,
        "seed": opts.seed,
        **({"data_seed": opts.data_seed} if getattr(opts, "data_seed", None) is not None else {}),
        measure: {"before": state["before"], "after": state["after"]},
    }


def run_facts(opts, target, state: dict, **seconds: float) -> dict:
    """How a frozen-target recipe ran, the end of its report: the command, torch's threads, the machine, then the
    wall seconds of each part named in `seconds` (generation, features: 0.1 s) and of training."""
    import torch

    return {
        "command": opts.command,
        "threads": torch.get_num_threads(),
        "cpu": machine_name(target.device),
        **{f"time_{part}_s": round(value, 1) for part, value in seconds.items()},
        "time_train_s": round(state["elapsed"], 1),
    }


def load_frozen_target(opts) -> tuple:
    """(tokenizer, target): the target at opts.frozen_dtype() on opts.device, eval mode, no weight requiring a
    gradient; on opts.threads."""
    from . import align
    from .tokenizer import TokenizerError, load_tokenizer

    set_threads(opts.threads)
    try:
        tok = load_tokenizer(opts.tokenizer_dir)
    except TokenizerError as e:
        raise TrainError(str(e)) from None
    target = align._load(opts.target, "target", opts.frozen_dtype(), opts.torch_device()).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return tok, target
