"""The benchmark's runners: Hugging Face generate / assisted / prompt lookup, and our loop with each drafter.

Every runner takes the same token ids [1, L] and returns a Measurement; the wall time is perf_counter around
the whole generate call (models, tokenizer and verifier objects are built once, outside the timing).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from time import perf_counter

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..cached_lm import CachedLM
from ..drafters.base import Drafter
from ..errors import DraftVerifyError
from ..loop import generate
from ..methods import MethodOptions, build_drafter, build_verifier
from ..types import SamplingParams
from .config import BenchConfig, GammaSpec
from .counting import ForwardCounter, step_accounting
from .models import BenchModels

HF_DEFAULT_ASSISTANT = GenerationConfig()  # transformers' shipped assistant settings (20 tokens, confidence 0.4)


@dataclass
class Measurement:
    new_ids: list[int]
    seconds: float  # wall time of the whole generate call
    target_calls: int  # target forwards that emit tokens (ours: after prefill; HF: every forward)
    draft_calls: int  # drafter model forwards (0 for model-free drafters)
    drafted: int
    accepted: int
    rejections: int
    stats: dict | None = None  # our GenerationStats.as_dict() (time split), None for HF runners
    hook_target_forwards: int = 0  # every forward of the target module seen by the hook (prefill included)
    hook_draft_forwards: int = 0

    @property
    def new_tokens(self) -> int:
        return len(self.new_ids)


@dataclass
class Runner(ABC):
    name: str  # unique row label, e.g. "model[g=4]"
    family: str  # see config.FAMILIES
    gamma: GammaSpec | None = None  # draft length setting (None: no drafting)
    lossless: bool = True  # output distributed exactly as the target's (greedy: identical text)
    settings: dict = field(default_factory=dict)  # early-exit layers, BiLD thresholds, HF assistant settings
    greedy_only: bool = False

    @property
    def kind(self) -> str:
        return "hf" if self.family.startswith("hf_") else "ours"

    @abstractmethod
    def run(self, input_ids: torch.Tensor, temperature: float, seed: int, max_new_tokens: int) -> Measurement:
        """Generate after input_ids [1, L]; sampling (temperature > 0) is seeded with `seed`."""

    def describe(self) -> dict:
        return {"name": self.name, "family": self.family, "kind": self.kind,
                "gamma": self.gamma, "lossless": self.lossless, "settings": self.settings}


@dataclass
class Hooks:
    target: ForwardCounter
    draft: ForwardCounter | None = None
    aligned: ForwardCounter | None = None

    def reset(self) -> None:
        for counter in (self.target, self.draft, self.aligned):
            if counter is not None:
                counter.reset()

    def remove(self) -> None:
        for counter in (self.target, self.draft, self.aligned):
            if counter is not None:
                counter.remove()


def _draft_hook_count(hooks: Hooks) -> int:
    return sum(len(c.take()) for c in (hooks.draft, hooks.aligned) if c is not None)


@dataclass
class HFRunner(Runner):
    """model.generate: plain (the baseline), with assistant_model (assisted) or prompt_lookup_num_tokens."""

    model: PreTrainedModel | None = None
    hooks: Hooks | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    assistant: PreTrainedModel | None = None
    assistant_settings: dict = field(default_factory=dict)  # written on assistant.generation_config each call
    prompt_lookup: int | None = None
    max_matching_ngram_size: int | None = None

    def generation_config(self, temperature: float, max_new_tokens: int) -> GenerationConfig:
        sampling = {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0} \
            if temperature > 0 else {"do_sample": False}
        extra = {}
        if self.prompt_lookup is not None:
            extra = {"prompt_lookup_num_tokens": self.prompt_lookup, "max_matching_ngram_size": self.max_matching_ngram_size}
        return GenerationConfig(max_new_tokens=max_new_tokens, num_beams=1, use_cache=True,
                                eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, **sampling, **extra)

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        config = self.generation_config(temperature, max_new_tokens)
        kwargs = {}
        if self.assistant is not None:
            # the assistant's settings live on (and are mutated through) its generation_config: reset every call
            for key, value in self.assistant_settings.items():
                setattr(self.assistant.generation_config, key, value)
            kwargs["assistant_model"] = self.assistant
        if temperature > 0:
            torch.manual_seed(seed)
        mask = torch.ones_like(input_ids)
        self.hooks.reset()
        started = perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=mask, generation_config=config,
                                      use_model_defaults=False, **kwargs)
        seconds = perf_counter() - started
        new_ids = out[0, input_ids.shape[1]:].tolist()
        calls = self.hooks.target.take()
        draft_forwards = _draft_hook_count(self.hooks)
        steps = step_accounting(calls, input_ids.shape[1], len(new_ids))
        return Measurement(new_ids=new_ids, seconds=seconds, target_calls=steps.target_calls,
                           draft_calls=draft_forwards, drafted=steps.drafted, accepted=steps.accepted,
                           rejections=steps.rejections, hook_target_forwards=len(calls),
                           hook_draft_forwards=draft_forwards)


@dataclass
class OursRunner(Runner):
    """draftverify.generate with one drafter (built once, reused across prompts) and a verifier per call."""

    target: CachedLM | None = None
    drafter: Drafter | None = None
    verifier: str = "exact"
    options: MethodOptions = field(default_factory=MethodOptions)
    hooks: Hooks | None = None
    eos_token_id: int | None = None

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        # standard speculative sampling, like the Hugging Face runners (seeded sampling is coupled by default;
        # its acceptance cost is measured by scripts/coupling_acceptance.py)
        params = SamplingParams(temperature=float(temperature), seed=seed if temperature > 0 else None, coupling=False)
        verifier = build_verifier(self.verifier, params, self.options)
        self.hooks.reset()
        started = perf_counter()
        out = generate(self.target, self.drafter, verifier, input_ids, params, max_new_tokens=max_new_tokens,
                       gamma=self.gamma if self.gamma is not None else 1, eos_token_id=self.eos_token_id)
        seconds = perf_counter() - started
        s = out.stats
        return Measurement(new_ids=out.new_tokens[0].tolist(), seconds=seconds, target_calls=s.target_calls,
                           draft_calls=s.draft_calls, drafted=s.drafted_tokens, accepted=s.accepted_tokens,
                           rejections=s.rejections, stats=s.as_dict(), hook_target_forwards=len(self.hooks.target.take()),
                           hook_draft_forwards=_draft_hook_count(self.hooks))


def default_early_exit_layers(num_layers: int) -> tuple[int, ...]:
    """About a quarter and half of the target's layers (at least 1, fewer than all)."""
    picks = sorted({max(1, round(num_layers * f)) for f in (0.25, 0.5)})
    return tuple(n for n in picks if n < num_layers)


def _gamma_label(g: GammaSpec) -> str:
    return f"g={g}" if isinstance(g, int) else str(g)


def _num(x: float) -> str:
    return f"{x:g}"


def build_runners(config: BenchConfig, models: BenchModels, hooks: Hooks) -> tuple[list[Runner], list[str]]:
    """The runner rows for this config, and notes on what was skipped and why."""
    notes: list[str] = []
    eos, pad = models.eos_token_id, models.pad_token_id
    target_lm = CachedLM(models.target, role="target")
    hf = dict(model=models.target, hooks=hooks, eos_token_id=eos, pad_token_id=pad)
    ours = dict(target=target_lm, hooks=hooks, eos_token_id=eos)
    fixed = [g for g in config.gammas if isinstance(g, int)]
    ours_gammas = list(config.gammas)
    quick_gammas = [g for g in ours_gammas if isinstance(g, int)] or ours_gammas[:1]  # --quick: auto for `model` only

    def drafter(name: str, **options) -> Drafter:  # through the method registry, as `draftverify generate` does
        return build_drafter(name, target_lm, MethodOptions(**options))

    runners: list[Runner] = [
        HFRunner("hf_generate", "hf_generate", **hf),
        OursRunner("ours_autoregressive", "ours_autoregressive", drafter=drafter("none"), **ours),
    ]

    def add_ours(family: str, proposer: Drafter, gammas, label: str = "", **extra) -> None:
        for g in gammas:
            inner = ",".join(p for p in (label, _gamma_label(g)) if p)
            runners.append(OursRunner(f"{family}[{inner}]", family, gamma=g, drafter=proposer, **ours, **extra))

    if config.wants("hf_assisted"):
        if models.draft is None:
            notes.append("hf_assisted skipped: no draft model")
        else:
            # constant gamma without the confidence-based early stop: exactly g drafts per step, like ours;
            # the heuristic schedule (start 5, +2 after a full accept, -1 otherwise) reset every call, like ours;
            # and transformers' shipped assistant defaults (20 tokens, confidence threshold 0.4) as they are
            settings = [(_gamma_label(g), g, {"num_assistant_tokens": g, "num_assistant_tokens_schedule": "constant",
                                              "assistant_confidence_threshold": 0.0}) for g in fixed]
            settings.append(("heuristic", "heuristic", {"num_assistant_tokens": 5,
                                                        "num_assistant_tokens_schedule": "heuristic_transient",
                                                        "assistant_confidence_threshold": 0.0}))
            settings.append(("hf-default", "hf-default", {
                "num_assistant_tokens": HF_DEFAULT_ASSISTANT.num_assistant_tokens,
                "num_assistant_tokens_schedule": HF_DEFAULT_ASSISTANT.num_assistant_tokens_schedule,
                "assistant_confidence_threshold": HF_DEFAULT_ASSISTANT.assistant_confidence_threshold}))
            for label, g, assistant_settings in settings:
                runners.append(HFRunner(f"hf_assisted[{label}]", "hf_assisted", gamma=g, **hf, assistant=models.draft,
                                        assistant_settings=assistant_settings, settings=dict(assistant_settings)))

    prompt_lookup = drafter("prompt_lookup")
    if config.wants("hf_prompt_lookup"):
        for g in fixed:
            runners.append(HFRunner(f"hf_prompt_lookup[{_gamma_label(g)}]", "hf_prompt_lookup", gamma=g, **hf,
                                    prompt_lookup=g, max_matching_ngram_size=MethodOptions().prompt_lookup_max_ngram,
                                    settings={"max_matching_ngram_size": MethodOptions().prompt_lookup_max_ngram}))

    draft_lm = CachedLM(models.draft, role="draft") if models.draft is not None else None
    if config.wants("model"):
        if draft_lm is None:
            notes.append("model skipped: no draft model")
        else:
            add_ours("model", drafter("model", draft_model=draft_lm), ours_gammas)
    if config.wants("model_aligned"):
        if models.aligned_draft is None:
            notes.append("model_aligned skipped: no aligned draft model")
        else:
            aligned_lm = CachedLM(models.aligned_draft, role="aligned draft")
            add_ours("model_aligned", drafter("model", draft_model=aligned_lm),
                     quick_gammas if config.quick else ours_gammas)
    if config.wants("ngram"):
        if models.ngram_path is None:
            notes.append("ngram skipped: no n-gram table")
        else:
            add_ours("ngram", drafter("ngram", ngram_path=models.ngram_path),
                     quick_gammas if config.quick else ours_gammas)
    if config.wants("prompt_lookup"):
        add_ours("prompt_lookup", prompt_lookup, quick_gammas if config.quick else ours_gammas,
                 settings={"max_ngram": prompt_lookup.max_ngram, "min_ngram": prompt_lookup.min_ngram})
    if config.wants("early_exit"):
        total = models.target.config.num_hidden_layers if hasattr(models.target.config, "num_hidden_layers") else None
        layers = config.early_exit_layers if config.early_exit_layers is not None else \
            default_early_exit_layers(total or 2)[: 1 if config.quick else None]
        if not layers:
            notes.append(f"early_exit skipped: the {total}-layer target has no proper prefix of layers")
        for n in layers:
            try:
                early = drafter("early_exit", early_exit_layers=n)
            except DraftVerifyError as err:
                if config.early_exit_layers is not None:
                    raise DraftVerifyError(f"--early-exit-layers {n}: {err}") from None
                notes.append(f"early_exit skipped: {err}")
                break
            add_ours("early_exit", early, quick_gammas if config.quick else ours_gammas, label=f"L={n}",
                     settings={"layers": n})
    if config.wants("bild"):
        if draft_lm is None:
            notes.append("bild skipped: no draft model")
        elif 0.0 not in config.temperatures:
            notes.append("bild skipped: it runs at temperature 0 only and --temperature has no 0")
        else:
            for fb in config.bild_fb:
                small = drafter("model", draft_model=draft_lm, alpha_fb=fb)  # one per alpha_FB, shared draft cache
                for rb in config.bild_rb:
                    runners.append(OursRunner(
                        f"bild[fb={_num(fb)},rb={_num(rb)}]", "bild", gamma=config.bild_gamma, lossless=False,
                        greedy_only=True, drafter=small, verifier="bild",
                        options=MethodOptions(alpha_fb=fb, alpha_rb=rb), **ours,
                        settings={"alpha_fb": fb, "alpha_rb": rb, "max_draft": config.bild_gamma}))
    return runners, notes


def install_hooks(models: BenchModels) -> Hooks:
    return Hooks(
        target=ForwardCounter(models.target),
        draft=ForwardCounter(models.draft) if models.draft is not None else None,
        aligned=ForwardCounter(models.aligned_draft) if models.aligned_draft is not None else None,
    )
