"""`draftverify bench ab`: settings of one method side by side in one process, each a pipeline of its own, every
setting on every prompt, the order rotated prompt by prompt and round by round so a drift in machine load hits
them alike. A setting is a value of a public option: a load() argument (gamma, dtype, draft_gguf, ...) or a
declared method option (options/), so whatever is compared here is what a user can choose."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import DraftVerifyError
from ..markdown import markdown_table
from ..options import all_fields
from ..options.declare import declaration, field_types
from .folders import DRAFT_POLICY

LOAD_ARGUMENTS = (
    "method",
    "draft",
    "gamma",
    "dtype",
    "backend",
    "draft_gguf",
    "target_gguf",
)  # load()'s that a setting may vary
TRUE, FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def parse_value(name: str, text: str) -> Any:
    """One option's value from its text, as the option takes it (a declared parse, bool, int, float or text)."""
    if name in LOAD_ARGUMENTS:
        return int(text) if name == "gamma" and text.isdigit() else text
    fields_ = all_fields()
    if name not in fields_:
        raise DraftVerifyError(
            f"bench ab: unknown option {name!r}; a setting names one of {', '.join(LOAD_ARGUMENTS)} "
            f"or a method option: {', '.join(sorted(fields_))}"
        )
    cls, f = fields_[name]
    opt = declaration(f)
    if opt is None:
        raise DraftVerifyError(f"bench ab: {name!r} is not a declared option (no flag): only public options vary")
    if opt.parse is not None:
        return opt.parse(text)
    kind = field_types(cls)[name]
    try:
        if kind is bool:
            if text.lower() not in TRUE + FALSE:
                raise ValueError(text)
            return text.lower() in TRUE
        return kind(text) if kind in (int, float) else text
    except ValueError:
        raise DraftVerifyError(f"bench ab: {name}={text!r} is not a {getattr(kind, '__name__', kind)}") from None


def parse_assignments(items: list[str], many: bool) -> dict[str, list[Any]]:
    """["NAME=V1,V2", ...] -> {name: [values]} (many=False: exactly one value each). Only the first '=' splits
    (gamma=conf=0.9); flags spelled with dashes (lookup-confirms) name the field (lookup_confirms)."""
    out: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        texts = [v.strip() for v in values.split(",")] if many else [values.strip()]
        if not sep or not name or not all(texts):
            raise DraftVerifyError(f"bench ab: {item!r} is not NAME=VALUE{'[,VALUE...]' if many else ''}")
        if name in out:
            raise DraftVerifyError(f"bench ab: {name} is given twice")
        out[name] = [parse_value(name, t) for t in texts]
    return out


def settings_from(vary: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the varied values, in the order given (the first is the reference)."""
    if not vary:
        raise DraftVerifyError("bench ab: give at least one --vary NAME=V1,V2")
    names = list(vary)
    settings = [dict(zip(names, combo)) for combo in itertools.product(*vary.values())]
    if len(settings) < 2:
        raise DraftVerifyError("bench ab: the varied options give one setting; name at least two values")
    return settings


def label(setting: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


@dataclass
class ABConfig:
    vary: dict[str, list[Any]]
    fixed: dict[str, Any] = field(default_factory=dict)  # load() arguments and method options every setting shares
    zoo: str | None = "code"
    target: str | None = None
    prompts: str = "humaneval"
    data_dir: str | Path | None = None
    first: int = 0  # first prompt: a choice made on the bench's prompts can be checked on others
    num_prompts: int = 8
    rounds: int = 3
    max_new_tokens: int = 128
    warmup_tokens: int = 32
    threads: int | None = None
    check_text: bool = True  # lossless settings must give the same text; a difference stops the run
    structured: Any = None  # processing.Structured every setting decodes under (structured output), or None
    out: str | Path = DRAFT_POLICY
    name: str = "ab"
    command: str = ""


def parse_structured(text: str):
    """--structured KIND=VALUE as a processing.Structured: json_schema=JSON, regex=RE, grammar=EBNF (each VALUE, or
    @FILE for a file's text), json_object=true."""
    from ..processing import STRUCTURED_KINDS, Structured

    kind, sep, value = text.partition("=")
    kind = kind.strip()
    if not sep or kind not in STRUCTURED_KINDS or kind == "choice":
        raise DraftVerifyError(
            f"bench ab: --structured {text!r} is not KIND=VALUE with KIND json_schema, json_object, regex or grammar"
        )
    if value.startswith("@"):
        try:
            value = Path(value[1:]).read_text()
        except OSError as err:
            raise DraftVerifyError(f"bench ab: --structured {kind}: cannot read {value[1:]!r}: {err}") from None
    if kind == "json_object":
        if value.lower() not in TRUE:
            raise DraftVerifyError(f"bench ab: --structured json_object takes true, got {value!r}")
        return Structured(json_object=True)
    return Structured(**{kind: value})


def load_setting(cfg: ABConfig, setting: dict[str, Any]):
    from ..api import load

    values = {**cfg.fixed, **setting}
    args = {k: values.pop(k) for k in LOAD_ARGUMENTS if k in values}
    args.setdefault("threads", cfg.threads)  # llama.cpp's threads (torch's are set once for the run)
    return load(target=cfg.target, zoo=None if cfg.target else cfg.zoo, **args, **values)


def alternating_rounds(
    generate: Callable[[int, str], Any], count: int, texts: list[str], rounds: int, check_text: bool, first: int
) -> list[list[list[float]]]:
    """Per round, per setting: [new tokens, target calls, draft calls, seconds]. Each prompt runs every setting,
    the order rotated by prompt and round; with check_text, settings that give different texts stop the run."""
    out = []
    for r in range(rounds):
        totals = [[0, 0, 0, 0.0] for _ in range(count)]
        for i, text in enumerate(texts):
            shift = (i + r) % count
            seen = set()
            for s in list(range(shift, count)) + list(range(shift)):
                result = generate(s, text)
                stats = result.output.stats
                seen.add(result.text)
                totals[s][0] += stats.new_tokens
                totals[s][1] += stats.target_calls
                totals[s][2] += stats.draft_calls
                totals[s][3] += stats.time_total
            if check_text and len(seen) != 1:
                raise DraftVerifyError(
                    f"bench ab: prompt {first + i}: the settings gave different texts (settings "
                    "that change the output need --no-check-text)"
                )
        out.append(totals)
    return out


def summarize(rounds: list[list[list[float]]], settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting: median tok/s over rounds, the median and range of its ratio to the first setting's
    tok/s, tokens per target call, draft forwards."""
    rows = []
    for s, setting in enumerate(settings):
        speeds = [r[s][0] / r[s][3] for r in rounds]
        ratios = [speed / (r[0][0] / r[0][3]) for speed, r in zip(speeds, rounds)]
        calls = sum(r[s][1] for r in rounds)
        rows.append(
            {
                "setting": setting,
                "tokens_per_second": statistics.median(speeds),
                "vs_reference": statistics.median(ratios),
                "vs_reference_range": [min(ratios), max(ratios)],
                "tokens_per_call": sum(r[s][0] for r in rounds) / calls if calls else None,
                "draft_calls": sum(r[s][2] for r in rounds) // len(rounds),
            }
        )
    return rows


def _spec_value(spec) -> Any:
    return getattr(spec, spec.kind)


def render(result: dict[str, Any]) -> str:
    cfg = result["config"]
    fixed = ", ".join(f"{k}={v}" for k, v in cfg["fixed"].items()) or "the defaults"
    structured = cfg.get("structured")
    if structured:
        fixed += "; structured output " + ", ".join(f"{k} `{v}`" for k, v in structured.items())
    lines = [
        f"# {result['name']}",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores); "
        f"{cfg['target'] or 'zoo ' + str(cfg['zoo'])}, {fixed}; {cfg['prompts']} prompts "
        f"{cfg['first']}..{cfg['first'] + cfg['num_prompts'] - 1} x {cfg['max_new_tokens']} tokens, greedy, "
        f"{cfg['rounds']} rounds in one process, the settings alternating prompt by prompt"
        + ("; every setting gave the same text on every prompt" if cfg["check_text"] else "")
        + ". "
        "**vs reference**: median over rounds of tok/s over the first setting's, with the range over rounds; "
        "draft forwards per round.",
        "",
    ]
    cells = [
        (label(row["setting"]), f"{row['tokens_per_second']:.1f}")
        + (f"{row['vs_reference']:.3f}x ({row['vs_reference_range'][0]:.3f}-{row['vs_reference_range'][1]:.3f})",)
        + ("-" if row["tokens_per_call"] is None else f"{row['tokens_per_call']:.2f}", row["draft_calls"])
        for row in result["rows"]
    ]
    columns = ("setting", "tok/s (median round)", "vs reference", "tokens / call", "draft forwards")
    return "\n".join(lines + markdown_table(columns, cells, "lrrrr") + [""])


def run_ab(cfg: ABConfig, echo: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Load one pipeline per setting, warm each up, run the rounds, write OUT/NAME.json and OUT/NAME.md."""
    import torch

    from . import environment
    from .prompts import load_prompts
    from .report import write_json

    for name, value in (
        ("num_prompts", cfg.num_prompts),
        ("rounds", cfg.rounds),
        ("max_new_tokens", cfg.max_new_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DraftVerifyError(f"bench ab: {name} must be a whole number >= 1, got {value!r}")
    if cfg.first < 0:
        raise DraftVerifyError(f"bench ab: first must be >= 0, got {cfg.first}")
    settings = settings_from(cfg.vary)
    clash = sorted(set(cfg.vary) & set(cfg.fixed))
    if clash:
        raise DraftVerifyError(f"bench ab: {', '.join(clash)} both varied and set")
    texts = [p.text for p in load_prompts(cfg.prompts, cfg.data_dir)[cfg.first : cfg.first + cfg.num_prompts]]
    if not texts:
        raise DraftVerifyError(f"bench ab: {cfg.prompts} has no prompt {cfg.first}")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    processing = None
    if cfg.structured is not None:
        from ..processing import Processing

        processing = Processing(structured=cfg.structured)
    pipes = []
    for setting in settings:
        echo(f"loading {label(setting)}")
        pipes.append(load_setting(cfg, setting))
        if cfg.warmup_tokens:
            pipes[-1].generate(texts[0], max_new_tokens=cfg.warmup_tokens, processing=processing)
    rounds = alternating_rounds(
        lambda s, text: pipes[s].generate(text, max_new_tokens=cfg.max_new_tokens, processing=processing),
        len(settings),
        texts,
        cfg.rounds,
        cfg.check_text,
        cfg.first,
    )
    config = {
        "vary": cfg.vary,
        "fixed": cfg.fixed,
        "zoo": cfg.zoo,
        "target": cfg.target,
        "prompts": cfg.prompts,
        "first": cfg.first,
        "num_prompts": len(texts),
        "rounds": cfg.rounds,
        "max_new_tokens": cfg.max_new_tokens,
        "warmup_tokens": cfg.warmup_tokens,
        "threads": cfg.threads,
        "check_text": cfg.check_text,
        "structured": None if cfg.structured is None else {cfg.structured.kind: _spec_value(cfg.structured)},
    }
    result = {
        **environment.header(cfg.name, cfg.command),
        "config": config,
        "rows": summarize(rounds, settings),
        "rounds": rounds,
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(result, out / f"{cfg.name}.json")
    (out / f"{cfg.name}.md").write_text(render(result))
    result["files"] = {"json": str(out / f"{cfg.name}.json"), "markdown": str(out / f"{cfg.name}.md")}
    return result
