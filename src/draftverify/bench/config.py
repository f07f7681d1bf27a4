"""BenchConfig: every knob of `draftverify bench speed`, parsed from strings and validated before any model is
loaded."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .. import devices
from ..draft_length import parse_gamma
from ..errors import DraftVerifyError
from ..options import check_files, check_names
from .folders import SPEED
from .native_spec import FAMILY as NATIVE, is_native, native_specs
from .prompts import prompt_set_name
from .runner_families import BASELINES, families

# an integer >= 1, "auto" (Theorem 8 online), "heuristic" (Hugging Face's +2/-1) or "conf[=T]" (auto's length as a
# cap, ending early at the draft's first unconfident token)
GammaSpec = int | str

DEFAULT_GAMMAS: tuple[GammaSpec, ...] = (2, 3, 4, 5, 6, 8, "auto")
DEFAULT_BILD_FB = (0.2, 0.4, 0.6, 0.8)
DEFAULT_BILD_RB = (1.0, 2.0, 3.0, 5.0)
FULL_PROMPTS, FULL_NEW_TOKENS = 20, 128
QUICK_PROMPTS, QUICK_NEW_TOKENS, QUICK_GAMMA = 2, 8, 3
FULL_TEMPERATURES, QUICK_TEMPERATURES = (0.0, 1.0), (0.0,)
FULL_WARMUP_TOKENS, QUICK_WARMUP_TOKENS = 16, 0  # --quick is a smoke test: its timings are not read, no warm-up
QUICK_BITA_MASKS = 1  # bita_tree's full top-k tree over every mask token is the slowest row by far
DEFAULT_ZOO = "code"  # what `draftverify bench speed` measures when given no models, as the README's commands assume


@dataclass
class BenchConfig:
    """None means "the default for this mode" (full run or --quick); see resolved()."""

    prompts: str = "humaneval"  # humaneval | spec_bench | spec_bench:<category> | a prompt file (.jsonl or text)
    data_dir: str | Path | None = None  # default $DRAFTVERIFY_DATA, else the copies shipped in the package
    num_prompts: int | None = None  # 20 (quick: 2)
    max_new_tokens: int | None = None  # 128 (quick: 8)
    temperatures: tuple[float, ...] | None = None  # (0, 1) (quick: greedy only)
    zoo: str | None = None  # default "code" (the shipped models) unless --target is given
    target: str | Path | None = None
    draft: str | Path | None = None
    aligned_draft: str | Path | None = None
    dtype: str = "auto"  # auto: the one that fits `device` (devices.py); resolved() names it
    device: str = "cpu"  # cpu, cuda, cuda:N or mps: the target and drafts load there
    threads: int | None = None
    gammas: tuple[GammaSpec, ...] | None = None  # (2,3,4,5,6,8,auto) (quick: (3, auto))
    early_exit_layers: tuple[int, ...] | None = None  # default: about 1/4 and 1/2 of the target's layers
    bild_fb: tuple[float, ...] | None = None  # alpha_FB grid (quick: 0.4)
    bild_rb: tuple[float, ...] | None = None  # alpha_RB grid (quick: 2)
    bild_gamma: int = 10  # BiLD section 7.1.2: at most 10 consecutive small-model tokens
    # families to run (baselines always); None = all but llamacpp_native, whose rows (`llamacpp_native[...]`,
    # bench/llamacpp_native.py) run only when named
    runners: tuple[str, ...] | None = None
    seed: int = 0
    warmup_tokens: int | None = None  # one warm-up generation of this many tokens per runner row (16; quick: 0)
    compile: bool = False  # our runners: preallocated caches + torch.compile per verify width (warm-up compiles)
    # what runs our rows: "hf" (transformers) and/or "llamacpp" (llama.cpp via llama-cpp-python: rows named
    # llamacpp:<row>, the target and draft converted to GGUF at --dtype, greedy, checked against llama.cpp greedy)
    backends: tuple[str, ...] = ("hf",)
    # the draft model's GGUF type in the llama.cpp rows (ours on that backend and the llamacpp_draft peer alike):
    # None = backends.DEFAULT_DRAFT_GGUF
    draft_gguf: str | None = None
    # the target's GGUF type in every llama.cpp row (ours, llama-cpp-python's, llama.cpp's own): None = --dtype's
    # (float32 -> f32); q8_0 is what llama.cpp users run
    target_gguf: str | None = None
    # llama.cpp's flash attention in every llama.cpp row (ours, llama-cpp-python's, llama.cpp's own servers):
    # None = backends.llamacpp_kernels.FLASH_ATTENTION (on, as llama.cpp runs it); off, on a library without
    # llamafile, chains are bit-exact on the float files and the quantized types it names (llamacpp_kernels.py)
    flash_attn: bool | None = None
    out: str | Path = SPEED
    name: str | None = None  # file stem; default from the prompt set (+ "-quick")
    quick: bool = False
    plots: bool = True
    progress: bool = True
    command: str | None = None  # the command line to record; default: sys.argv
    notes: list[str] = field(default_factory=list)
    # declared drafter options (options/), by field name, e.g. {"ngram_path": FILE, "bita_topk": 2}: the rest take
    # their declared defaults, and files not given come from the zoo entry (quick: bita_masks 1)
    options: dict[str, Any] = field(default_factory=dict)

    def resolved(self) -> "BenchConfig":
        """Fill mode defaults and validate; raises DraftVerifyError naming the bad option."""
        quick = self.quick
        cfg = replace(self, notes=list(self.notes), options=dict(self.options))
        if cfg.num_prompts is None:
            cfg.num_prompts = QUICK_PROMPTS if quick else FULL_PROMPTS
        if cfg.max_new_tokens is None:
            cfg.max_new_tokens = QUICK_NEW_TOKENS if quick else FULL_NEW_TOKENS
        if cfg.gammas is None:
            cfg.gammas = (QUICK_GAMMA, "auto") if quick else DEFAULT_GAMMAS
        if cfg.temperatures is None:
            cfg.temperatures = QUICK_TEMPERATURES if quick else FULL_TEMPERATURES
        if cfg.warmup_tokens is None:
            cfg.warmup_tokens = QUICK_WARMUP_TOKENS if quick else FULL_WARMUP_TOKENS
        if quick and cfg.options.get("bita_masks") is None:
            cfg.options["bita_masks"] = QUICK_BITA_MASKS
        if cfg.bild_fb is None:
            cfg.bild_fb = (0.4,) if quick else DEFAULT_BILD_FB
        if cfg.bild_rb is None:
            cfg.bild_rb = (2.0,) if quick else DEFAULT_BILD_RB
        if quick:
            cfg.bild_gamma = min(cfg.bild_gamma, QUICK_GAMMA + 1)
            if cfg.early_exit_layers is not None:
                cfg.early_exit_layers = cfg.early_exit_layers[:1]
        if cfg.zoo is None and cfg.target is None:
            cfg.zoo = DEFAULT_ZOO
        device, cfg.dtype = devices.resolve(cfg.device, cfg.dtype)
        if device.type != "cpu" and "llamacpp" in cfg.backends:
            raise DraftVerifyError("--backend llamacpp runs on the CPU only here: use --device cpu for its rows")
        if cfg.draft_gguf is None:
            from ..backends import DEFAULT_DRAFT_GGUF

            cfg.draft_gguf = DEFAULT_DRAFT_GGUF
        if cfg.name is None:
            cfg.name = "bench-" + prompt_set_name(cfg.prompts) + ("-quick" if quick else "")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        check_names(self.options)
        check_files(self.options)
        _positive_int("--num-prompts", self.num_prompts)
        _positive_int("--max-new-tokens", self.max_new_tokens)
        _positive_int("--bild-gamma", self.bild_gamma)
        _check_gamma(self.bild_gamma)
        if isinstance(self.warmup_tokens, bool) or not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise DraftVerifyError(f"warmup_tokens must be an integer >= 0, got {self.warmup_tokens!r}")
        if not isinstance(self.compile, bool):
            raise DraftVerifyError(f"compile must be True or False, got {self.compile!r}")
        if self.threads is not None:
            _positive_int("--threads", self.threads)
        if not self.temperatures:
            raise DraftVerifyError("--temperature needs at least one value (0 = greedy)")
        for t in self.temperatures:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
                raise DraftVerifyError(f"--temperature values must be numbers >= 0 (0 = greedy), got {t!r}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise DraftVerifyError(f"--temperature lists a value twice: {list(self.temperatures)}")
        if not self.gammas:
            raise DraftVerifyError("--gamma needs at least one value")
        for g in self.gammas:
            _check_gamma(g)
        for name, values, low, high in (("--bild-fb", self.bild_fb, 0.0, 1.0), ("--bild-rb", self.bild_rb, 0.0, None)):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low or (high is not None and v > high):
                    rng = f"[{low:g}, {high:g}]" if high is not None else f">= {low:g}"
                    raise DraftVerifyError(f"{name} values must be numbers in {rng}, got {v!r}")
        if self.early_exit_layers is not None:
            for n in self.early_exit_layers:
                _positive_int("--early-exit-layers", n)
        if self.runners is not None:
            known = families()
            native_specs(self.runners)  # a bad llamacpp_native[...] spec: its own one-line error
            unknown = [r for r in self.runners if r not in known and not is_native(r)]
            if unknown:
                raise DraftVerifyError(
                    f"--runners: unknown runner famil{'y' if len(unknown) == 1 else 'ies'} "
                    f"{', '.join(unknown)}; choose from {', '.join(known)}, {NATIVE}[...]"
                )
        from ..backends.registry import target_backends

        names = target_backends()
        if (
            not self.backends
            or any(b not in names for b in self.backends)
            or len(set(self.backends)) != len(self.backends)
        ):
            raise DraftVerifyError(
                f"--backend takes a comma list of {', '.join(names)} without repeats, got {','.join(self.backends)!r}"
            )
        if self.compile and "llamacpp" in self.backends:
            raise DraftVerifyError("--compile is for the hf backend; run --backend llamacpp without it")
        if self.draft_gguf is not None:
            from ..backends import check_draft_gguf

            check_draft_gguf(self.draft_gguf)
        if self.target_gguf is not None:
            from ..backends import check_gguf_type

            check_gguf_type(self.target_gguf, "--target-gguf", "target")
        if not self.name or "/" in self.name:
            raise DraftVerifyError(f"--name must be a non-empty file stem without '/', got {self.name!r}")
        if "llamacpp" in self.backends:  # after the options' own checks: a wrong option is named as such anywhere
            from ..backends.llamacpp import require_llama_cpp

            require_llama_cpp()  # asked for by name: a missing extra or library stops here, before any model loads

    def wants(self, family: str) -> bool:
        return family in BASELINES or self.runners is None or family in self.runners

    def llamacpp_flash_attn(self) -> bool:
        """Flash attention in the llama.cpp rows: --flash-attn / --no-flash-attn, else llama.cpp's default (on)."""
        from ..backends.llamacpp_kernels import FLASH_ATTENTION

        return FLASH_ATTENTION if self.flash_attn is None else self.flash_attn

    def target_gguf_type(self) -> str:
        """The converter's --outtype for the target in the llama.cpp rows: --target-gguf, else --dtype's."""
        from ..backends.llamacpp import GGUF_TYPES

        return self.target_gguf or GGUF_TYPES[self.dtype]

    def as_dict(self) -> dict:
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        out["options"] = {k: _plain(v) for k, v in self.options.items()}
        return out


def _plain(value: object) -> object:
    """A config value as JSON records it."""
    return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value


def _positive_int(option: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DraftVerifyError(f"{option} must be an integer >= 1, got {value!r}")
    return value


def _check_gamma(g: object) -> None:
    if isinstance(g, str) and g.isdecimal():  # a config holds integers as ints
        raise DraftVerifyError(f"--gamma values must be integers >= 1, 'auto', 'heuristic' or 'conf[=T]', got {g!r}")
    try:
        parse_gamma(g)  # the one bound on a draft length (MAX_GAMMA)
    except DraftVerifyError as err:
        raise DraftVerifyError(f"--gamma: {err}") from None


# ---------------------------------------------------------------- parsing comma lists from the command line


def _items(option: str, text: str) -> list[str]:
    items = [part.strip() for part in str(text).split(",")]
    if not items or any(not part for part in items):
        raise DraftVerifyError(f"{option} takes a comma-separated list without empty items, got {text!r}")
    return items


def parse_floats(option: str, text: str) -> tuple[float, ...]:
    out = []
    for part in _items(option, text):
        if part.lower() == "greedy":
            out.append(0.0)
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise DraftVerifyError(f"{option}: {part!r} is not a number (in {text!r})") from None
    return tuple(out)


def parse_ints(option: str, text: str) -> tuple[int, ...]:
    out = []
    for part in _items(option, text):
        if not part.lstrip("-").isdigit():
            raise DraftVerifyError(f"{option}: {part!r} is not an integer (in {text!r})")
        out.append(int(part))
    return tuple(out)


def parse_gammas(text: str) -> tuple[GammaSpec, ...]:
    out: list[GammaSpec] = []
    for part in _items("--gamma", text):
        if part in ("auto", "heuristic", "conf") or part.startswith("conf="):
            out.append(part)
        elif part.lstrip("-").isdigit():
            out.append(int(part))
        else:
            raise DraftVerifyError(
                f"--gamma: {part!r} is not an integer, 'auto', 'heuristic' or 'conf[=T]' (in {text!r})"
            )
    for g in out:
        _check_gamma(g)
    return tuple(dict.fromkeys(out))


def parse_names(option: str, text: str) -> tuple[str, ...]:
    return tuple(_items(option, text))


def split_top_level(option: str, text: str) -> list[str]:
    """A comma list whose items may hold commas inside brackets: "a,b[x,y]" -> ["a", "b[x,y]"]."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            break
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise DraftVerifyError(f"{option}: unbalanced brackets in {text!r}")
    items = [part.strip() for part in items + [text[start:]]]
    if any(not part for part in items):
        raise DraftVerifyError(f"{option} takes a comma-separated list without empty items, got {text!r}")
    return items


def parse_runners(text: str) -> tuple[str, ...]:
    """--runners: families, and llamacpp_native[...] rows whose brackets hold commas."""
    return tuple(split_top_level("--runners", text))


@dataclass(frozen=True)
class ModelChoice:
    """Which models a bench study runs, the zoo's (`zoo`) or a target and drafts of one's own (then the zoo is not
    read), and where its prompt sets are (None: $DRAFTVERIFY_DATA, else the shipped copies)."""

    zoo: str | None = DEFAULT_ZOO
    target: str | None = None
    draft: str | None = None
    aligned_draft: str | None = None
    data_dir: str | Path | None = None

    def load_args(self) -> dict[str, Any]:
        """The target and draft as load() takes them (no zoo when a target is given)."""
        return {"zoo": None if self.target else self.zoo, "target": self.target, "draft": self.draft}

    def named(self) -> dict[str, Any]:
        """The models as BenchConfig and a study's recorded settings name them (no zoo when a target is given)."""
        return {**self.load_args(), "aligned_draft": self.aligned_draft}

    def greedy_config(self, threads: int | None, num_prompts: int, max_new_tokens: int, **settings) -> BenchConfig:
        """A resolved BenchConfig of these models for a study that times rows against each other at temperature 0
        (the rows' greedy texts are compared), with no progress bar or plots; `settings`: the study's own fields."""
        return BenchConfig(
            **self.named(),
            data_dir=self.data_dir,
            temperatures=(0.0,),
            threads=threads,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            progress=False,
            plots=False,
            **settings,
        ).resolved()
