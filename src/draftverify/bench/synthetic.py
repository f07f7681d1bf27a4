"""`draftverify bench synthetic`: our loop against llama.cpp's at the sizes users run, with acceptance drawn at
random on both sides, so the comparison is of the two loops and their drafting and verify costs, not of a draft.

The zoo's models are small, where a token costs little and a wide verify pass is cheap. Here the target is a
random-weight model with the shape of a common small model (SHAPES: Qwen2.5-0.5B, Llama-3.2-1B), the draft a
random two-layer model of the same family and vocabulary (draft_shape), both converted to GGUF by the converter
and quantized by llama-quantize as every other GGUF here (backends/gguf.py), the zoo's tokenizer padded to the
shape's vocabulary. The weights say nothing, so acceptance is synthetic on both sides, the same rule:

- llama.cpp: `llama-server --spec-type draft-simple --spec-draft-p-min 0 --spec-synth-rates r1,...,rG`, which
  accepts draft position i (given the ones before it kept) with probability r_i / r_(i-1) and then appends the
  target's own token (tools/server/server-context.cpp, server_sample_and_accept_synth);
- ours: `model` on the llama.cpp backend at each of our draft lengths (a fixed G, or `auto`: the cost model's
  length from this run's measured acceptance and verify cost), verified by SyntheticVerifier with the same rates and
  rule. SyntheticVerifier is not registered as a verifier: `generate` and `serve` cannot reach it, since its text
  is not the target's.

The draws are the same numbers on both sides: each prompt of each round carries one seed (request_seed), which
llama-server takes as the request's `seed` and ours draws from as libstdc++ does (CppUniform: uniform_real_distribution
over std::mt19937). At the same draft length the two loops then keep the same positions step by step, so what
separates them there is what a step costs each; rows at other lengths draw from the same streams too, so the rows
of one rate differ by their lengths, not by their luck.

rates: r_i = alpha ** i for each --alpha (i = 1..G): alpha is the chance each drafted token is kept given the one
before it was, as in Leviathan et al.'s analysis (expected tokens per target call (1 - alpha^(G+1)) / (1 - alpha)).
Both sides generate exactly --max-new-tokens per prompt (EOS ignored: a random model may emit it anywhere).

Each side runs its own settings (llama.cpp: --spec-draft-n-max values; ours: draft lengths), and the table sets each
side's fastest row per acceptance rate against the other's, and the two rows at the one length both ran side by
side (the same draws keep the same positions there: what a step of draft and verify costs each loop).
"""

from __future__ import annotations

import math
import random
import shutil
import statistics
import sys
import zlib
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..draft_length import MAX_GAMMA
from ..errors import DraftVerifyError
from ..sampling import argmax_lists
from ..types import Draft, SamplingParams, Verdict
from ..verifiers.base import Verifier
from .config import GammaSpec
from .folders import SPEED
from .llamacpp_native import NativeRunner
from .native_spec import FAMILY as NATIVE
from .runners import OursRunner

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (what a forward costs), in Hugging Face config terms. architecture: "qwen2" or "llama"."""

    architecture: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float = 10000.0

    def config(self, token_id: int):
        """The transformers config of a model of this shape; token_id: its BOS / EOS id (the tokenizer's)."""
        from transformers import LlamaConfig, Qwen2Config

        kinds = {"qwen2": Qwen2Config, "llama": LlamaConfig}
        if self.architecture not in kinds:
            raise DraftVerifyError(f"unknown architecture {self.architecture!r}; use one of {', '.join(kinds)}")
        return kinds[self.architecture](
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            rope_theta=self.rope_theta,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=token_id,
            eos_token_id=token_id,
        )


# the published configs' dimensions (Llama-3.2-1B's llama3 rope scaling left out: it changes no cost)
SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, 1000000.0),
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, 500000.0),
}


def draft_shape(target: Shape) -> Shape:
    """The draft of a target shape: two layers of width 256 over the target's vocabulary (its output layer is most
    of its cost, as for the small drafts users pair with such targets)."""
    return replace(target, hidden=256, intermediate=1024, layers=2, heads=4, kv_heads=1)


def random_model(name: str, shape: Shape, tokenizer_dir: Path, cache: Path, seed: int) -> Path:
    """A Hugging Face folder with random fp16 weights of `shape` and the tokenizer of tokenizer_dir, made once in
    cache/NAME (written beside it, then renamed: a half-made folder never lands)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = cache / name
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if shape.vocab < len(tokenizer):
        raise DraftVerifyError(f"{name}: a vocabulary of {shape.vocab} cannot hold the tokenizer's {len(tokenizer)}")
    token_id = tokenizer.eos_token_id or 0
    work = cache / f".making-{name}"
    shutil.rmtree(work, ignore_errors=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(shape.config(token_id), dtype=torch.float16)
    model.save_pretrained(work)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).is_file():
            shutil.copy(tokenizer_dir / file, work / file)
    work.rename(folder)
    return folder


def conditional_rates(rates: tuple[float, ...]) -> list[float]:
    """Unconditional per-position rates r_1 >= r_2 >= ... -> the chance of keeping position i given i-1 kept (as
    llama.cpp's common_speculative_init derives it)."""
    out, previous = [], 1.0
    for rate in rates:
        out.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return out


def alpha_rates(alpha: float, gamma: int) -> tuple[float, ...]:
    return tuple(alpha**i for i in range(1, gamma + 1))


def mt19937_state(seed: int) -> tuple[int, ...]:
    """The 624 words std::mt19937(seed) starts from (the C++ standard's seeding, init_genrand)."""
    words = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        previous = words[-1]
        words.append((1812433253 * (previous ^ (previous >> 30)) + i) & 0xFFFFFFFF)
    return tuple(words)


class CppUniform:
    """std::uniform_real_distribution<double>(0, 1) drawing from std::mt19937(seed), value for value as libstdc++
    draws it: llama-server's synthetic acceptance draws so (server_sample_and_accept_synth, its slot's generator
    seeded with the request's `seed`), and our rows seeded alike draw the same numbers, so at the same draft length
    both loops keep the same positions step by step. The generator is Python's own Mersenne Twister (random.Random)
    set to std::mt19937's starting state; a draw is generate_canonical<double, 53>: two 32-bit outputs, (first +
    second * 2^32) / 2^64 in double arithmetic, just below 1 where that rounds up to 1."""

    def __init__(self, seed: int):
        self.words = random.Random()
        self.words.setstate((3, (*mt19937_state(seed), 624), None))  # 624: the first draw twists the state

    def __call__(self) -> float:
        low = float(self.words.getrandbits(32))
        value = (low + float(self.words.getrandbits(32)) * 4294967296.0) / 18446744073709551616.0
        return value if value < 1.0 else math.nextafter(1.0, 0.0)


def request_seed(prompt: list[int], round_index: int) -> int:
    """The acceptance draws' seed of one prompt in one round, the same on both sides: a 32-bit CRC of both, never
    0xFFFFFFFF (llama-server's LLAMA_DEFAULT_SEED, which it replaces with a random one)."""
    return zlib.crc32(array("q", [round_index, *prompt]).tobytes()) % 0xFFFFFFFF


class SyntheticVerifier(Verifier):
    """Benchmarking only (never registered): keeps draft position i with probability conditional[i] given the
    ones before it kept, then appends the target's greedy token at the first position not kept (or after the
    draft). Reads the target's logits as the greedy rule does (one argmax over [B, N+1, V]), so a step costs what
    a greedy step costs. As llama.cpp's rule: one draw per position until the first not kept, and a drafted
    end-of-generation token (is_eog) is not kept whatever its draw."""

    name = "synthetic"
    supports_batch = True

    def __init__(
        self, rates: tuple[float, ...], draw: Callable[[], float], is_eog: Callable[[int], bool] = lambda t: False
    ):
        self.conditional = conditional_rates(rates)
        self.draw = draw
        self.is_eog = is_eog

    def verify(self, draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator) -> Verdict:
        choice = argmax_lists(target_logits)
        limits = draft.lengths.tolist() if draft.lengths is not None else [draft.length] * len(choice)
        rows, accepted = [], []
        for mine, theirs, limit in zip(draft.rows, choice, limits):
            n = 0
            while n < min(limit, len(self.conditional)) and self.draw() < self.conditional[n]:
                if self.is_eog(mine[n]):
                    break
                n += 1
            rows.append(mine[:n] + [theirs[n]] + [-1] * (draft.length - n))
            accepted.append(n)
        return Verdict.of_chain(rows, accepted, draft.tokens.device)


@dataclass
class SyntheticRunner(OursRunner):
    """Our loop verifying with SyntheticVerifier at `rates`, its draws seeded per prompt and round as llama.cpp's
    rows are (request_seed)."""

    rates: tuple[float, ...] = ()
    is_eog: Callable[[int], bool] = field(default=lambda t: False, repr=False)
    round_index: int = 0
    _seed: int = 0

    def new_round(self) -> None:
        super().new_round()
        self.round_index += 1

    def run(self, input_ids, temperature, seed, max_new_tokens):
        self._seed = request_seed(input_ids[0].tolist(), self.round_index)
        return super().run(input_ids, temperature, seed, max_new_tokens)

    def make_verifier(self, params: SamplingParams, seed: int) -> Verifier:
        return SyntheticVerifier(self.rates, CppUniform(self._seed), self.is_eog)


@dataclass
class SyntheticNativeRunner(NativeRunner):
    """A llama-server row with synthetic acceptance, each request seeded as our rows' draws are (request_seed)."""

    round_index: int = 0

    def new_round(self) -> None:
        super().new_round()
        self.round_index += 1

    def request_seed(self, prompt: list[int]) -> int | None:
        return request_seed(prompt, self.round_index)


def ours_name(gamma: GammaSpec, alpha: float) -> str:
    return f"llamacpp:model[{gamma_label(gamma)}]@{alpha:g}"


def native_name(n_max: int, alpha: float) -> str:
    return f"{NATIVE}[draft-simple,n_max={n_max},p_min=0]@{alpha:g}"


def gamma_label(gamma: GammaSpec) -> str:
    return f"g={gamma}" if isinstance(gamma, int) else str(gamma)


def build_rows(
    target: Path,
    draft: Path,
    alphas,
    lengths: SideLengths,
    threads: int,
    n_ctx: int,
    flash_attn: bool,
) -> list:
    """Both sides' plain rows and, per alpha, ours at each of our draft lengths and llama.cpp's at each n_max
    (llama-servers started)."""
    from ..backends.gguf import SERVER, tools_dir
    from ..backends.llamacpp import GGUFModel, LlamaCppLM
    from ..methods import MethodOptions, build_drafter
    from .counting import ForwardCounter
    from .llamacpp_native import NativeServer
    from .runners import Hooks

    binary = tools_dir() / SERVER
    target_lm = LlamaCppLM(GGUFModel.shared(target), role="target", threads=threads, flash_attn=flash_attn)
    draft_lm = LlamaCppLM(GGUFModel.shared(draft), role="draft", threads=threads, flash_attn=flash_attn)
    hooks = Hooks(target=ForwardCounter(torch.nn.Identity()))  # our rows' models are not torch modules
    common = dict(target=target_lm, hooks=hooks, eos_token_id=None, greedy_only=True, lossless=False)
    model_file = target_lm.model

    def is_eog(token: int) -> bool:  # llama.cpp's own test, on the same file's vocabulary
        return bool(model_file.lib.llama_vocab_is_eog(model_file.vocab, token))

    plain = build_drafter("none", target_lm, MethodOptions())
    rows: list = [OursRunner("llamacpp:ours_autoregressive", "ours_autoregressive", drafter=plain, **common)]

    def server(label: str, extra: list[str], synthetic: bool = True) -> NativeRunner:
        started = NativeServer(binary, target, threads, n_ctx, extra, label, flash_attn=flash_attn, ignore_eos=True)
        kind = SyntheticNativeRunner if synthetic else NativeRunner
        return kind(label, NATIVE, greedy_only=True, lossless=False, server=started)

    rows.append(server(f"{NATIVE}[plain]", [], synthetic=False))
    model = build_drafter("model", target_lm, MethodOptions(draft_model=draft_lm, lookup_tokens=0))
    for alpha in alphas:
        for gamma in lengths.ours:
            rates = alpha_rates(alpha, gamma if isinstance(gamma, int) else MAX_GAMMA)
            name = ours_name(gamma, alpha)
            rows.append(
                SyntheticRunner(name, "model", gamma=gamma, drafter=model, rates=rates, is_eog=is_eog, **common)
            )
        for n_max in lengths.native:
            spec = ["--spec-type", "draft-simple", "--spec-draft-model", str(draft)]
            spec += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
            spec += ["--spec-draft-n-max", str(n_max), "--spec-draft-p-min", "0"]
            # the rates' exact doubles (shortest round-trip form), so both sides compare draws with the same numbers
            spec += ["--spec-synth-rates", ",".join(repr(r) for r in alpha_rates(alpha, n_max))]
            rows.append(server(native_name(n_max, alpha), spec))
    return rows


@dataclass(frozen=True)
class SideLengths:
    """Each side's draft-length settings: ours (fixed lengths or `auto`) and llama.cpp's --spec-draft-n-max values.
    Raises DraftVerifyError (one line) on a length that is not a whole number >= 1 (or auto, ours)."""

    ours: tuple[GammaSpec, ...] = (4, "auto")
    native: tuple[int, ...] = (2, 4)

    def __post_init__(self) -> None:
        for flag, values, words in (("--gamma", self.ours, ("auto",)), ("--native-n-max", self.native, ())):
            if not values:
                raise DraftVerifyError(f"{flag} needs at least one draft length")
            for value in values:
                whole = isinstance(value, int) and not isinstance(value, bool) and value >= 1
                if not whole and value not in words:
                    also = " or auto (the cost model's length)" if words else ""
                    raise DraftVerifyError(f"{flag} takes whole numbers >= 1{also}, got {value!r}")

    @property
    def shared(self) -> int | None:
        """The longest fixed length both sides run (their loops compared step for step there), None if none."""
        both = set(self.native) & {g for g in self.ours if isinstance(g, int)}
        return max(both) if both else None


def check_alphas(alphas: tuple[float, ...]) -> None:
    if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
        raise DraftVerifyError(f"--alpha takes numbers in [0, 1], got {','.join(f'{a:g}' for a in alphas) or 'none'}")


def run_synthetic(
    shapes: tuple[str, ...] = tuple(SHAPES),
    target_ggufs: tuple[str, ...] = ("q8_0", "q4_k_m"),
    alphas: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9),
    lengths: SideLengths = SideLengths(),
    rounds: int = 3,
    num_prompts: int = 4,
    max_new_tokens: int = 64,
    threads: int | None = 2,
    out: str | Path = SPEED,
    name: str = "bench-synthetic",
    command: str = "",
    echo: Callable[[str], None] = lambda line: None,
    known_shapes: dict[str, Shape] = SHAPES,
    data_dir: str | Path | None = None,
) -> dict:
    """Every (shape, target GGUF type) cell, `rounds` rounds each, rows interleaved prompt by prompt; writes
    OUT/NAME.json and OUT/NAME.md. The random models and their GGUFs are made once and cached."""
    from ..backends import DEFAULT_DRAFT_GGUF, check_gguf_type
    from ..backends.gguf import gguf_cache_dir, gguf_for, llama_cpp_dir
    from ..backends.llamacpp_kernels import FLASH_ATTENTION, library
    from ..zoo import zoo_folder
    from . import environment
    from .config import BenchConfig
    from .prompts import load_prompts
    from .report import markdown_table, write_result
    from .run import measure, tokens_per_call, tokens_per_second

    unknown = [s for s in shapes if s not in known_shapes]
    if unknown or not shapes:
        raise DraftVerifyError(
            f"--shapes: unknown shape {unknown[0] if unknown else ''!r}; use {', '.join(known_shapes)}"
        )
    for gguf in target_ggufs:
        check_gguf_type(gguf, "--target-gguf", "target")
    check_alphas(alphas)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise DraftVerifyError(f"--rounds must be a whole number >= 1, got {rounds!r}")
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    tokenizer_dir = zoo_folder("code") / "target"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = load_prompts("humaneval", data_dir)[:num_prompts]
    chosen = [(p, tokenizer(p.text, return_tensors="pt").input_ids) for p in prompts]
    config = BenchConfig(
        zoo="code", temperatures=(0.0,), num_prompts=num_prompts, max_new_tokens=max_new_tokens, warmup_tokens=8,
        progress=False, plots=False,
    ).resolved()  # fmt: skip
    cache = gguf_cache_dir() / "shapes"
    cache.mkdir(parents=True, exist_ok=True)
    source = llama_cpp_dir()
    cells = []
    result = {
        "name": name,
        "command": command,
        "date": environment.now(),
        "machine": environment.machine(),
        "settings": {"gammas": list(lengths.ours), "native_n_max": list(lengths.native),
                     "shared_length": lengths.shared, "alphas": list(alphas), "rounds": rounds, "threads": threads,
                     "num_prompts": len(chosen), "max_new_tokens": max_new_tokens},
        "cells": cells,
    }  # fmt: skip
    for shape_name in shapes:
        shape = known_shapes[shape_name]
        echo(f"{shape_name}: making the random models (once)")
        target_dir = random_model(f"{shape_name}-target", shape, tokenizer_dir, cache, seed=0)
        draft_dir = random_model(f"{shape_name}-draft", draft_shape(shape), tokenizer_dir, cache, seed=1)
        draft = gguf_for(draft_dir, DEFAULT_DRAFT_GGUF, source)
        for gguf in target_ggufs:
            target = gguf_for(target_dir, gguf, source)
            n_ctx = max(ids.shape[1] for _, ids in chosen) + max_new_tokens + MAX_GAMMA + 16
            rows = build_rows(target, draft, alphas, lengths, threads, n_ctx, FLASH_ATTENTION)
            if "llama_cpp_library" not in result:  # loaded now: llama-cpp-python's own, or LLAMA_CPP_LIB_PATH's
                result["llama_cpp_library"] = library(sys.modules["llama_cpp.llama_cpp"])
            try:
                per_round, calls = [], []
                for r in range(rounds):
                    for row in rows:
                        row.new_round()
                    records = measure(rows, config if r == 0 else replace(config, warmup_tokens=0), chosen, tokenizer)
                    per_round.append(tokens_per_second(records))
                    calls.append(tokens_per_call(records))
                    echo(
                        f"{shape_name} {gguf} round {r + 1}: "
                        + ", ".join(f"{k} {v:.1f}" for k, v in per_round[-1].items())
                    )
            finally:
                for row in rows:
                    row.close()
            median = {row: statistics.median(x[row] for x in per_round) for row in per_round[0]}
            cells.append(
                {
                    "shape": shape_name,
                    "target_gguf": gguf,
                    "target": target.name,
                    "draft": draft.name,
                    "rounds": per_round,
                    "median_tokens_per_second": median,
                    "tokens_per_call": {row: statistics.mean(x[row] for x in calls) for row in calls[0]},
                }
            )
            write_result(result, out, name, lambda res: render(res, markdown_table))
    return write_result(result, out, name, lambda res: render(res, markdown_table))


def render(result: dict, markdown_table) -> str:
    from ..backends.llamacpp_kernels import FLASH_ATTENTION, library_lines

    s = result["settings"]
    shared = s["shared_length"]
    ours_lengths = ", ".join(gamma_label(g) for g in s["gammas"])
    lines = [
        "# Synthetic acceptance at the sizes users run",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores), {s['threads']} "
        f"threads; {s['num_prompts']} HumanEval prompts x {s['max_new_tokens']} tokens; ours `model` at "
        f"{ours_lengths}, llama.cpp's draft-simple at n_max {', '.join(map(str, s['native_n_max']))}; "
        f"{s['rounds']} rounds, rows interleaved prompt by prompt; tok/s is the median round. Random weights: "
        "acceptance is drawn, each drafted token kept with chance alpha given the one before it kept, both sides "
        "drawing the same numbers (one seed per prompt and round, llama-server's generator reproduced on ours), so "
        "at the same length they keep the same positions. Each side's fastest row per alpha is set against the "
        "other's."
        + (
            f" The last column sets the two rows at the length both ran ({shared}) against each other: the same "
            "draws keep the same positions there, so it is what a step of draft and verify costs each loop. "
            "(llama.cpp's tokens/call count the prompt's own call, which emits the first token; ours decode the "
            "prompt with the first verify pass.)"
            if shared
            else ""
        ),
        "",
        *library_lines(result.get("llama_cpp_library"), FLASH_ATTENTION),
    ]
    head = ["shape", "target", "alpha", "llama.cpp best", "tok/s", "tokens/call", "ours best", "tok/s",
            "tokens/call", "ours / llama.cpp"]  # fmt: skip
    if shared:
        head.append(f"at length {shared}, ours / llama.cpp")
    body = []
    for c in result["cells"]:
        median, calls = c["median_tokens_per_second"], c["tokens_per_call"]
        ours_plain, native_plain = "llamacpp:ours_autoregressive", f"{NATIVE}[plain]"
        ratio = median[ours_plain] / median[native_plain]
        body.append(
            [c["shape"], c["target_gguf"], "plain", "plain", f"{median[native_plain]:.1f}", "1.00", "plain",
             f"{median[ours_plain]:.1f}", "1.00", f"{ratio:.2f}x"] + ([f"{ratio:.2f}x"] if shared else [])
        )  # fmt: skip
        for alpha in s["alphas"]:
            n_max = max(s["native_n_max"], key=lambda n: median[native_name(n, alpha)])
            gamma = max(s["gammas"], key=lambda g: median[ours_name(g, alpha)])
            native, ours = native_name(n_max, alpha), ours_name(gamma, alpha)
            row = [c["shape"], c["target_gguf"], f"{alpha:g}", f"n_max={n_max}", f"{median[native]:.1f}",
                   f"{calls[native]:.2f}", gamma_label(gamma), f"{median[ours]:.1f}", f"{calls[ours]:.2f}",
                   f"{median[ours] / median[native]:.2f}x"]  # fmt: skip
            if shared:
                mine, theirs = ours_name(shared, alpha), native_name(shared, alpha)
                row.append(f"{median[mine] / median[theirs]:.2f}x")
            body.append(row)
    lines += markdown_table(head, body)
    lines.append("")
    return "\n".join(lines)
