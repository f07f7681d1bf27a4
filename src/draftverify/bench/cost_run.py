"""`draftverify bench speed --cost-curve`: measure the cost curve (cost.py) for each mode, write JSON, markdown, PNG."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import devices
from ..errors import DraftVerifyError
from . import environment
from .cost import (
    DEFAULT_SIZES,
    MODES,
    REFERENCE_MODE,
    LlamaCppForward,
    Mode,
    StaticForward,
    check_sizes,
    compile_settings,
    equality,
    greedy_tokens,
    model_for,
    time_widths,
)
from .folders import COST
from .prompts import load_prompts
from .report import write_json

QUICK_SIZES = (1, 2)


@dataclass
class CostConfig:
    zoo: str | None = None
    target: str | Path | None = None
    sizes: tuple[int, ...] | None = None  # default DEFAULT_SIZES (quick: 1, 2)
    modes: tuple[str, ...] = MODES
    context: int = 120  # tokens before the scored ones (real code: the prompt set's texts, concatenated)
    warmup: int | None = None  # untimed calls per width, the first compiles (default 3; quick 1)
    repeats: int | None = None  # timed calls per width (default 20; quick 2)
    equality_prompts: int | None = None  # prompts for the greedy equality check (default 8; quick 2)
    equality_tokens: int | None = None  # greedy tokens per prompt (default 64; quick 8)
    prompts: str = "humaneval"
    data_dir: str | Path | None = None
    threads: int | None = None
    device: str = "cpu"  # where the target runs; each mode names its dtype
    out: str | Path = COST
    name: str | None = None  # default cost-<zoo or target folder>[-quick]
    quick: bool = False
    plots: bool = True
    command: str | None = None
    notes: list[str] = field(default_factory=list)

    def resolved(self) -> "CostConfig":
        quick = self.quick
        defaults = {
            "sizes": QUICK_SIZES if quick else DEFAULT_SIZES,
            "warmup": 1 if quick else 3,
            "repeats": 2 if quick else 20,
            "equality_prompts": 2 if quick else 8,
            "equality_tokens": 8 if quick else 64,
        }
        cfg = CostConfig(**{**asdict(self), **{k: v for k, v in defaults.items() if getattr(self, k) is None}})
        if cfg.zoo is None and cfg.target is None:
            cfg.zoo = "code"
        cfg.sizes = check_sizes(tuple(cfg.sizes))
        devices.resolve_device(cfg.device)
        for name in ("context", "repeats", "equality_prompts", "equality_tokens"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftVerifyError(f"cost curve: {name} must be an integer >= 1, got {value!r}")
        if isinstance(cfg.warmup, bool) or not isinstance(cfg.warmup, int) or cfg.warmup < 1:
            raise DraftVerifyError(
                f"cost curve: warmup must be an integer >= 1 (the first call compiles), got {cfg.warmup!r}"
            )
        if not cfg.modes:
            raise DraftVerifyError("--cost-modes needs at least one mode")
        for mode in cfg.modes:
            Mode.parse(mode)
        if cfg.name is None:
            stem = cfg.zoo if cfg.zoo is not None else Path(str(cfg.target)).name
            cfg.name = f"cost-{stem}" + ("-quick" if quick else "")
        return cfg


def _context_and_prompts(tokenizer, config: CostConfig, limit: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The context [1, C]: the prompt set's texts joined until C tokens; equality prompts that fit `limit`."""
    prompts = load_prompts(config.prompts, config.data_dir)
    ids: list[int] = []
    for p in prompts:
        ids += tokenizer(p.text).input_ids
        if len(ids) >= config.context:
            break
    if len(ids) < config.context:
        raise DraftVerifyError(f"the prompt set {config.prompts!r} has only {len(ids)} tokens; lower the context")
    chosen = []
    for p in prompts:
        prompt = tokenizer(p.text, return_tensors="pt").input_ids  # [1, L]
        if 0 < prompt.shape[1] and prompt.shape[1] + config.equality_tokens <= limit:
            chosen.append(prompt)
        if len(chosen) == config.equality_prompts:
            break
    return torch.tensor([ids[: config.context]]), chosen


def run_cost(config: CostConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Measure every mode; returns the result (also written as JSON, markdown and PNG into config.out)."""
    from transformers import AutoTokenizer

    from ..api import zoo_paths
    from ..backends.hf.cached_lm import context_limit

    config = config.resolved()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    say = progress or (lambda _: None)
    target = Path(config.target) if config.target is not None else zoo_paths(config.zoo)["target"]
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    reference_model = model_for(target, "float32", config.device)
    limit = context_limit(reference_model.config) or 1 << 30
    if config.context + max(config.sizes) > limit:
        raise DraftVerifyError(
            f"context {config.context} + {max(config.sizes)} scored tokens exceed the target's {limit} positions"
        )
    context, prompts = _context_and_prompts(tokenizer, config, limit)
    context, prompts = context.to(config.device), [p.to(config.device) for p in prompts]
    timing_len = config.context + max(config.sizes)
    greedy_len = max(p.shape[1] for p in prompts) + config.equality_tokens
    modes: dict[str, dict] = {}
    reference: list[list[int]] | None = None
    for name in sorted(config.modes, key=lambda m: m != REFERENCE_MODE):  # the reference first
        mode = Mode.parse(name)
        say(f"{name}: loading")
        if mode.backend == "llamacpp":  # the same target as GGUF on llama.cpp's kernels (converted once, cached)
            runner = LlamaCppForward(target, mode.dtype, torch.get_num_threads())
            config.notes.append(
                f"{name}: the target converted to GGUF ({runner.lm.model.path.name}) and scored by "
                f"the llama.cpp backend (llama_decode, {runner.lm.threads} threads, llama.cpp's "
                "default KV cache), not a StaticCache; its greedy tokens are llama.cpp's"
            )
            points, first_call = time_widths(
                runner, context, config.sizes, config.warmup, config.repeats, lambda text: say(f"{name}: {text}")
            )
            tokens = [greedy_tokens(runner, p, config.equality_tokens) for p in prompts]
            modes[name] = {
                "compiled": False,
                "dtype": mode.dtype,
                "backend": "llamacpp",
                "first_call_seconds": first_call,
                "points": [
                    {"n": p.n, "median_ms": p.median_ms, "min_ms": p.min_ms, "seconds": p.seconds} for p in points
                ],
                "greedy_tokens": tokens,
            }
            continue
        model = reference_model if name == REFERENCE_MODE else model_for(target, mode.dtype, config.device)
        with compile_settings(graphs=2 * len(config.sizes) + 4):
            runner = StaticForward(model, timing_len, mode.compiled, mode.few_row)
            points, first_call = time_widths(
                runner, context, config.sizes, config.warmup, config.repeats, lambda text: say(f"{name}: {text}")
            )
            greedy_runner = StaticForward(model, greedy_len, mode.compiled, mode.few_row)
            tokens = [greedy_tokens(greedy_runner, p, config.equality_tokens) for p in prompts]
        if name == REFERENCE_MODE:
            reference = tokens
        modes[name] = {
            "compiled": mode.compiled,
            "dtype": mode.dtype,
            "first_call_seconds": first_call,
            "points": [{"n": p.n, "median_ms": p.median_ms, "min_ms": p.min_ms, "seconds": p.seconds} for p in points],
            "greedy_tokens": tokens,
        }
    for name, entry in modes.items():
        entry["equality"] = equality(reference, entry["greedy_tokens"]) if reference is not None else None
    if reference is None:
        config.notes.append(f"no {REFERENCE_MODE} mode: no greedy equality rates")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / f"{config.name}.json"), "markdown": str(out / f"{config.name}.md")}
    command = config.command or "draftverify bench speed --cost-curve"
    result = {
        **environment.header(config.name, command, config.device),
        "config": _jsonable_config(config),
        "target": str(target),
        "label": f"{config.zoo} zoo target" if config.zoo else target.name,
        "context_tokens": int(context.shape[1]),
        "equality_prompts": len(prompts),
        "modes": modes,
        "notes": config.notes,
        "files": files,
    }
    if config.plots:
        from .cost_report import plot_cost

        files["png"] = str(plot_cost(result, out / f"{config.name}.png"))
    from .cost_report import render_cost_markdown

    write_json(result, Path(files["json"]))
    Path(files["markdown"]).write_text(render_cost_markdown(result))
    return result


def _jsonable_config(config: CostConfig) -> dict:
    return {
        k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
        for k, v in asdict(config).items()
    }
