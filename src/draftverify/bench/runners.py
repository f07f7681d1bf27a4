"""The benchmark's runners: Hugging Face generate / assisted / prompt lookup, and our loop with each method.

Every runner takes the same token ids [1, L] and returns a Measurement; the wall time is perf_counter around
the whole generate call (models, tokenizer and verifier objects are built once, outside the timing). Which rows
exist is decided in lineup.py: peers.py for other libraries, ours.py from the method registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from itertools import product
from time import perf_counter

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..backends.hf.cached_lm import CachedLM
from ..backends.hf.compiled_widths import WIDTH_BUCKETS, bucket
from ..compiling import compiled_models, max_verify_width
from ..draft_length import KeptPolicies, StepCosts
from ..drafters.base import Drafter
from ..loop import generate
from ..methods import MethodOptions, build_verifier
from ..types import SamplingParams
from ..verifiers.base import Verifier
from .config import GammaSpec
from .counting import ForwardCounter, step_accounting
from .models import BenchModels


@dataclass
class Measurement:
    new_ids: list[int]
    seconds: float  # wall time of the whole generate call
    target_calls: int  # target forwards that emit tokens (ours: after prefill; HF: every forward)
    draft_calls: int  # drafter model forwards (0 for model-free drafters)
    drafted: int
    accepted: int
    rejections: int
    # our GenerationStats.as_dict() (time split); llama-server's timings for the llamacpp_native rows; None for HF
    stats: dict | None = None
    hook_target_forwards: int = 0  # every forward of the target module seen by the hook (prefill included)
    hook_draft_forwards: int = 0
    overshoot: int = 0  # tokens generated past max_new_tokens, cut off before comparing and counting

    @property
    def new_tokens(self) -> int:
        return len(self.new_ids)


@dataclass
class Runner(ABC):
    name: str  # unique row label, e.g. "model[g=4]"
    family: str  # see config.families()
    gamma: GammaSpec | None = None  # draft length setting (None: no drafting)
    lossless: bool = True  # output distributed exactly as the target's (greedy: identical text)
    settings: dict = field(default_factory=dict)  # early-exit layers, BiLD thresholds, HF assistant settings
    greedy_only: bool = False
    reference: str | None = None  # the row whose greedy tokens this one must equal (None: hf_generate)
    group: str | None = None  # its family in the head-to-head (None: family), e.g. one per llama.cpp --spec-type
    # filled by the warm-up (run.measure): its seconds (compilation included), torch.compile compilations then,
    # and compilations during the timed generations (must stay 0: a compilation there would be timed)
    warmup_seconds: float | None = None
    warmup_compiles: int = 0
    timed_compiles: int = 0

    @property
    def kind(self) -> str:
        """ "ours", or the peer library: "hf" (hf_*) or "llamacpp" (llamacpp*)."""
        if self.family.startswith("hf_"):
            return "hf"
        return "llamacpp" if self.family.startswith("llamacpp") else "ours"

    @abstractmethod
    def run(self, input_ids: torch.Tensor, temperature: float, seed: int, max_new_tokens: int) -> Measurement:
        """Generate after input_ids [1, L]; sampling (temperature > 0) is seeded with `seed`."""

    @property
    def compiled(self) -> bool:
        """Runs through torch.compile'd forwards (ours with --compile)."""
        return bool(self.compiled_roles())

    def compiled_roles(self) -> list[str]:
        """The roles of the compiled models it runs ("target", "draft", ...); none for eager runners."""
        return []

    def prepare(self, input_ids: torch.Tensor, requests: tuple[int, ...] = ()) -> None:
        """Before the warm-up generation: compile what the runner will run (nothing for eager runners)."""

    def new_round(self) -> None:
        """Before a round of bench rounds after the first: forget what earlier requests taught it (a llama-server's
        n-gram cache), so a round does not draft from the texts of the same prompts in the rounds before."""

    def close(self) -> None:
        """After the last generation: stop what the runner started (a llama-server process); nothing for most."""

    def describe(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "kind": self.kind,
            "reference": self.reference,
            "group": self.group or self.family,
            "gamma": self.gamma,
            "lossless": self.lossless,
            "settings": self.settings,
            "compiled": self.compiled,
            "compiled_models": self.compiled_roles(),
            "warmup_seconds": self.warmup_seconds,
            "warmup_compiles": self.warmup_compiles,
            "timed_compiles": self.timed_compiles,
        }


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
    # an assistant with its own tokenizer: both tokenizers go to generate() (universal assisted generation)
    tokenizer: object | None = None
    assistant_tokenizer: object | None = None

    def generation_config(self, temperature: float, max_new_tokens: int) -> GenerationConfig:
        sampling = (
            {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        extra = {}
        if self.prompt_lookup is not None:
            extra = {
                "prompt_lookup_num_tokens": self.prompt_lookup,
                "max_matching_ngram_size": self.max_matching_ngram_size,
            }
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            num_beams=1,
            use_cache=True,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            **sampling,
            **extra,
        )

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        config = self.generation_config(temperature, max_new_tokens)
        kwargs = {}
        if self.assistant is not None:
            # the assistant's settings live on (and are mutated through) its generation_config: reset every call
            for key, value in self.assistant_settings.items():
                setattr(self.assistant.generation_config, key, value)
            kwargs["assistant_model"] = self.assistant
            if self.assistant_tokenizer is not None:
                kwargs.update(tokenizer=self.tokenizer, assistant_tokenizer=self.assistant_tokenizer)
        if temperature > 0:
            torch.manual_seed(seed)
        mask = torch.ones_like(input_ids)
        self.hooks.reset()
        started = perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=mask, generation_config=config, **kwargs)
        seconds = perf_counter() - started
        emitted = out[0, input_ids.shape[1] :].tolist()
        calls = self.hooks.target.take()
        draft_forwards = _draft_hook_count(self.hooks)
        steps = step_accounting(calls, input_ids.shape[1], len(emitted))  # what the forwards really produced
        # HF prompt lookup can keep a whole accepted draft past max_new_tokens; those extra tokens are the greedy
        # continuation, so comparing or counting them would call a lossless peer lossy and inflate its tokens/s
        return Measurement(
            new_ids=emitted[:max_new_tokens],
            seconds=seconds,
            target_calls=steps.target_calls,
            draft_calls=draft_forwards,
            drafted=steps.drafted,
            accepted=steps.accepted,
            rejections=steps.rejections,
            hook_target_forwards=len(calls),
            hook_draft_forwards=draft_forwards,
            overshoot=max(0, len(emitted) - max_new_tokens),
        )


@dataclass
class OursRunner(Runner):
    """draftverify.generate with one drafter (built once, reused across prompts) and a verifier per call."""

    target: CachedLM | None = None  # or any backend (backends/base.py): the llamacpp rows run a LlamaCppLM
    drafter: Drafter | None = None
    verifier: str = "exact"
    options: MethodOptions = field(default_factory=MethodOptions)
    hooks: Hooks | None = None
    eos_token_id: int | None = None
    # gamma auto / conf: one policy per temperature, kept across this row's prompts as a Pipeline keeps them (one
    # StepCosts for the row, seeded from the target's measured cost curve where it has one: llama.cpp); made at the
    # row's first generation (its warm-up), when the target is known
    policies: KeptPolicies | None = field(default=None, repr=False)
    # True: each prompt on its own (the main bench). False: the drafter keeps what earlier prompts taught it (the
    # suffix cache) until the next round, as a server keeps it across requests: bench native, beside llama-server's
    # n-gram caches, which live as long as the server
    forget_each_prompt: bool = True

    def _compiled(self) -> list[tuple[CachedLM, bool]]:
        """(model, lags) for each compiled CachedLM this runner calls (compiling.compiled_models)."""
        return compiled_models(self.target, self.drafter)

    def compiled_models(self) -> list[CachedLM]:
        return [lm for lm, _ in self._compiled()]

    def compiled_roles(self) -> list[str]:
        return [lm.role for lm in self.compiled_models()]

    def max_width(self) -> int:
        """Widest forward this runner's verification should need (compiling.max_verify_width)."""
        return max_verify_width(self.drafter, self.gamma if self.gamma is not None else 1)

    def prepare(self, input_ids: torch.Tensor, requests: tuple[int, ...] = ()) -> None:
        """Compile every width bucket up to max_width() of each compiled model (the target and draft models; a
        lagging draft model every bucket), after prefilling input_ids [1, L], for the cache size of each request
        length in `requests` (prompt + max_new_tokens: a cache is sized per request, so each size is its own
        graph; without requests, the one input_ids gives); a model shared with an earlier runner
        finds its graphs already compiled. The warm-up generation that follows catches what a drafter does beyond
        this; what still compiles in a timed generation is counted (timed_compiles) and warned about."""
        widths = [b for b in WIDTH_BUCKETS if b <= bucket(self.max_width())]
        # a drafter that reads the target's hidden states (blockwise heads) has it verify with them: other graphs
        hidden = bool(getattr(self.drafter, "needs_target_hidden", False))
        with torch.inference_mode():
            for (lm, lags), positions in product(self._compiled(), requests or (input_ids.shape[1],)):
                lm.check_fits(positions)  # sizes the cache as a generation of that length does
                for width in WIDTH_BUCKETS if lags else widths:
                    if input_ids.shape[1] + width > lm.window:
                        break
                    lm.start(input_ids)
                    lm.forward(
                        torch.zeros((input_ids.shape[0], width), dtype=torch.long, device=lm.device),
                        want_hidden=hidden and lm is self.target,
                    )
                    lm.commit(0)

    def new_round(self) -> None:
        self.drafter.forget()

    def make_verifier(self, params: SamplingParams, seed: int) -> Verifier:
        """The verifier of one generation: the named rule (a bench-only rule overrides this)."""
        return build_verifier(self.verifier, params, self.options)

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        # standard speculative sampling, like the Hugging Face runners (seeded sampling is coupled by default,
        # which accepts somewhat less; the bench compares methods at the peers' own rule)
        params = SamplingParams(temperature=float(temperature), seed=seed if temperature > 0 else None, coupling=False)
        verifier = self.make_verifier(params, seed)
        self.hooks.reset()
        # each prompt on its own: no text of the warm-up, another row or another temperature is reused (a
        # cross-request cache is measured by bench replay)
        if self.forget_each_prompt:
            self.drafter.forget()
        if self.policies is None:
            context = getattr(self.target, "max_positions", None)
            curve = getattr(self.target, "cost_curve", None)
            self.policies = KeptPolicies(StepCosts(), context, curve, self.drafter.longest_draft)
        gamma = self.policies.get(self.gamma if self.gamma is not None else 1, temperature)
        started = perf_counter()
        out = generate(
            self.target,
            self.drafter,
            verifier,
            input_ids,
            params,
            max_new_tokens=max_new_tokens,
            gamma=gamma,
            eos_token_id=self.eos_token_id,
        )
        seconds = perf_counter() - started
        s = out.stats
        return Measurement(
            new_ids=out.new_tokens[0].tolist(),
            seconds=seconds,
            target_calls=s.target_calls,
            draft_calls=s.draft_calls,
            drafted=s.drafted_tokens,
            accepted=s.accepted_tokens,
            rejections=s.rejections,
            stats=s.as_dict(),
            hook_target_forwards=len(self.hooks.target.take()),
            hook_draft_forwards=_draft_hook_count(self.hooks),
        )


def install_hooks(models: BenchModels) -> Hooks:
    return Hooks(
        target=ForwardCounter(models.target),
        draft=ForwardCounter(models.draft) if models.draft is not None else None,
        aligned=ForwardCounter(models.aligned_draft) if models.aligned_draft is not None else None,
    )
