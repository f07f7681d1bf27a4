"""Our runner rows, derived from the method registry (methods.METHODS + MethodOptions), never from method names.

A method registered in `methods.METHODS` shows up in the benchmark without editing this module. What the bench
needs to know about a method it learns from the registry and by building the method's objects:

- lossless: the method's verifier is "exact" (greedy at temperature 0, speculative sampling otherwise);
- the resources it needs (a draft model, an n-gram table): building it without one raises DraftVerifyError;
- the options it reads: two values of an option build drafters / verifiers whose plain attributes differ.

Rows per method, from those facts:
- lossless methods run at every --gamma and every temperature; a method that reads `early_exit_layers` once per
  layer count; one that needs a draft model also as `<method>_aligned` with the aligned draft (the aligned
  draft changes speed, never the output, so the pair measures alignment alone);
- lossy methods (BiLD, SpecDec++, ...) trade quality for speed, judged against the target's greedy output: they
  run greedy only, at the longest draft --bild-gamma, over the --bild-fb x --bild-rb grid of the thresholds
  they read (a fallback threshold in the drafter, a rollback threshold in the verifier);
- the method whose drafter is "none" is the `ours_autoregressive` baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Callable

from ..backends.hf.cached_lm import CachedLM, cached_model
from ..backends.lean_draft import draft_backend
from ..errors import DraftVerifyError, OptionValueError
from ..methods import Method, MethodOptions, build_drafter, build_verifier
from ..types import SamplingParams
from .config import BenchConfig, GammaSpec
from .models import BenchModels
from .runner_families import ALIGNED_SUFFIX, GGUF_SUFFIX, drafting_methods

GREEDY = SamplingParams(temperature=0.0)
# options swept by the bench, and the label each gets in a row name
EARLY_EXIT = "early_exit_layers"
LOSSY_GRID = ("alpha_fb", "alpha_rb")
LABELS = {EARLY_EXIT: "L", "alpha_fb": "fb", "alpha_rb": "rb"}
SETTING_NAMES = {EARLY_EXIT: "layers", "alpha_fb": "alpha_fb", "alpha_rb": "alpha_rb"}


def default_early_exit_layers(num_layers: int) -> tuple[int, ...]:
    """About a quarter and half of the target's layers (at least 1, fewer than all)."""
    picks = sorted({max(1, round(num_layers * f)) for f in (0.25, 0.5)})
    return tuple(n for n in picks if n < num_layers)


@dataclass
class RowSpec:
    """One row to build: its label, the options for its drafter and verifier, and how it runs."""

    name: str
    family: str
    method: Method
    options: MethodOptions
    gamma: GammaSpec
    lossless: bool
    settings: dict = field(default_factory=dict)


PLAIN = (bool, int, float, str, type(None))


def _plain_attributes(obj) -> dict:
    """The attributes that configure an object (numbers, strings, tuples of them); models, caches and the objects
    an attribute holds on to (a verifier's rules) are left out."""
    return {
        k: v
        for k, v in vars(obj).items()
        if isinstance(v, PLAIN) or (isinstance(v, tuple) and all(isinstance(x, PLAIN) for x in v))
    }


class MethodProbe:
    """Builds one method's drafter and verifier from options, to learn what the method needs and reads."""

    def __init__(self, method: Method, target: CachedLM):
        self.method, self.target = method, target

    def drafter(self, options: MethodOptions):
        return build_drafter(self.method.drafter, self.target, options)

    def verifier(self, options: MethodOptions):
        return build_verifier(self.method.verifier, GREEDY, options)

    def drafts_with_model(self, options: MethodOptions) -> bool:
        """The drafter needs the draft model (building fails without it) or runs it where given (`earn` offers its
        drafts beside the lookups' without one): a method with an aligned-draft twin."""
        try:
            without = self.drafter(options.replace(draft_model=None))
        except DraftVerifyError:
            return True
        return len(self.drafter(options).models()) > len(without.models())

    def reads(self, options: MethodOptions, option: str, values: tuple) -> bool:
        """The drafter or verifier is configured differently for two values of `option`."""
        builders: tuple[Callable, ...] = (self.drafter, self.verifier)
        for build in builders:
            try:
                seen = [_plain_attributes(build(options.replace(**{option: v}))) for v in values]
            except DraftVerifyError:  # a value the method rejects (e.g. as many layers as the target has)
                return True
            if seen[0] != seen[1]:
                return True
        return False


def plan_rows(
    config: BenchConfig, models: BenchModels, target: CachedLM, drafts: tuple | None = None
) -> tuple[list[RowSpec], list[str]]:
    """The rows of every drafting method this config wants, and notes on what was skipped and why.

    target: the hf backend's CachedLM, or another backend (backends/base.py) with its draft models in `drafts`
    (draft, aligned draft); on another backend only the lossless methods it can run get rows (greedy)."""
    notes: list[str] = []
    # one CachedLM per draft model, shared by every row (with --compile: preallocated and compiled, so the rows
    # share its compiled widths); early-exit drafters compile their own layer prefix through options.compile
    compile = config.compile
    hf = target.name == "hf"
    if drafts is not None:
        draft, aligned = drafts
    else:
        # draft models run on LeanLM where it applies (DRAFTVERIFY_LEAN_DRAFT=0: CachedLM; backends/lean_draft.py);
        # a draft with its own tokenizer keeps CachedLM (cross_tokenizer rolls its cache back past settled tokens)
        backend = draft_backend if models.draft_tokenizer is None else cached_model
        draft = backend(models.draft, "draft", compile) if models.draft is not None else None
        aligned = backend(models.aligned_draft, "aligned draft", compile) if models.aligned_draft is not None else None
    base = MethodOptions(
        draft_model=draft,
        draft_tokenizer=models.draft_tokenizer,
        target_tokenizer=models.tokenizer,
        compile=compile,
        **models.options,
    )
    total = getattr(models.target.config, "num_hidden_layers", None)
    layers = (
        config.early_exit_layers
        if config.early_exit_layers is not None
        else default_early_exit_layers(total or 2)[: 1 if config.quick else None]
    )
    rows: list[RowSpec] = []
    first_lossless = True
    for name, method in drafting_methods().items():
        wanted = [f for f in (name, name + ALIGNED_SUFFIX, name + GGUF_SUFFIX) if config.wants(f)]
        if not wanted:
            continue
        if not hf:
            from ..backends.base import check_backend
            from ..registry import DRAFTERS, lookup

            try:
                if method.verifier != "exact":
                    raise DraftVerifyError("lossy methods run on the hf backend only here")
                check_backend(target, lookup(DRAFTERS, "drafter", method.drafter), name)
            except DraftVerifyError as err:
                notes.append(f"{target.name}:{name} skipped: {err}")
                continue
        probe = MethodProbe(method, target)
        try:
            probe.drafter(base)
            probe.verifier(base)
        except OptionValueError:
            raise  # a value the user gave wrong stops the bench (exit 2), it does not leave the method out
        except DraftVerifyError as err:
            notes.append(f"{name} skipped: {err}")
            continue
        lossless = method.verifier == "exact"
        grid: dict[str, tuple] = {}
        if probe.reads(base, EARLY_EXIT, (1, 2)):
            if not layers:
                notes.append(f"{name} skipped: the {total}-layer target has no proper prefix of layers")
                continue
            grid[EARLY_EXIT] = tuple(layers)
        if not lossless:
            for option, values in zip(LOSSY_GRID, (config.bild_fb, config.bild_rb)):
                if probe.reads(base, option, (0.3, 0.6)):
                    grid[option] = tuple(values)
        drafts = [(name, base)]
        if name + ALIGNED_SUFFIX in wanted and lossless and probe.drafts_with_model(base):
            if aligned is None:
                notes.append(f"{name}{ALIGNED_SUFFIX} skipped: no aligned draft model")
            else:
                drafts.append(
                    (
                        name + ALIGNED_SUFFIX,
                        base.replace(draft_model=aligned, draft_tokenizer=models.aligned_draft_tokenizer),
                    )
                )
        elif lossless and config.runners is not None and name + ALIGNED_SUFFIX in config.runners:
            why = "this bench has no draft model" if base.draft_model is None else f"{name} runs no draft model"
            notes.append(f"{name}{ALIGNED_SUFFIX} skipped: {why}")
        if name + GGUF_SUFFIX in wanted and method.gguf_option:
            twin = gguf_twin(name, method.gguf_option, base, models, hf, notes)
            if twin is not None:
                drafts.append((name + GGUF_SUFFIX, twin))
        for family, options in drafts:
            if not config.wants(family):
                continue
            gammas = list(config.gammas) if lossless else [config.bild_gamma]
            if lossless and config.quick and not first_lossless:  # --quick: `auto` once, for the first family
                gammas = [g for g in gammas if isinstance(g, int)] or gammas[:1]
            first_lossless = first_lossless and not lossless
            for values in product(*grid.values()):
                swept = dict(zip(grid, values))
                for g in gammas:
                    rows.append(_row(family, method, options.replace(**swept), swept, g, lossless, config))
    return rows, notes


def gguf_twin(
    name: str, option: str, base: MethodOptions, models: BenchModels, hf: bool, notes: list[str]
) -> MethodOptions | None:
    """The options of `<name>_gguf`: the piece `option` names, as the GGUF file llama.cpp's converter makes of it
    (f16, converted against the target's folder, cached), for the drafter to run in llama.cpp; None, with a note,
    where that cannot run."""
    from ..backends.gguf import gguf_for

    family, piece = name + GGUF_SUFFIX, getattr(base, option)
    if hf:
        notes.append(f"{family} skipped: its piece runs in llama.cpp, beside a llama.cpp target (--backend llamacpp)")
    elif piece is None:
        notes.append(f"{family} skipped: no {option} to convert")
    elif not models.paths.get("target"):
        notes.append(f"{family} skipped: converting its piece needs the target's Hugging Face folder")
    else:
        path = Path(piece)
        gguf = path if path.suffix == ".gguf" else gguf_for(path, "f16", target_dir=Path(models.paths["target"]))
        return base.replace(**{option: gguf})
    return None


def _row(
    family: str,
    method: Method,
    options: MethodOptions,
    swept: dict,
    gamma: GammaSpec,
    lossless: bool,
    config: BenchConfig,
) -> RowSpec:
    parts = [f"{LABELS[k]}={v:g}" for k, v in swept.items()]
    settings = {SETTING_NAMES[k]: v for k, v in swept.items()}
    if lossless:
        parts.append(f"g={gamma}" if isinstance(gamma, int) else str(gamma))
    else:
        settings["max_draft"] = config.bild_gamma
    return RowSpec(
        name=f"{family}[{','.join(parts)}]",
        family=family,
        method=method,
        options=options,
        gamma=gamma,
        lossless=lossless,
        settings=settings,
    )
