"""Write the benchmark's JSON (everything) and markdown (tables + how to reproduce)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from ..markdown import command_block, markdown_table
from .summary import BASELINE, OURS_BASELINE


def write_json(result: dict, path: Path) -> None:
    path.write_text(json.dumps(_finite(result), indent=1, default=_jsonable, allow_nan=False) + "\n")


def write_result(result: dict, out: str | Path, name: str, render: Callable[[dict], str]) -> dict:
    """A bench's result written into folder `out` as NAME.json and NAME.md (render(result)); result["files"] then
    names the two (what run_reporting prints)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(result, folder / f"{name}.json")
    (folder / f"{name}.md").write_text(render(result))
    result["files"] = {"json": str(folder / f"{name}.json"), "markdown": str(folder / f"{name}.md")}
    return result


def _finite(value):
    """NaN / inf (which strict JSON cannot hold) become null, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _f(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}{suffix}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _temperature_title(t: float) -> str:
    return "Temperature 0 (greedy)" if t == 0 else f"Temperature {t:g} (sampling; ours: speculative sampling)"


MAIN_COLUMNS = (
    "runner",
    "gamma",
    "tok/s",
    "speedup",
    "tokens/call",
    "alpha",
    "target calls",
    "draft calls",
    "= baseline",
    "overshoot",
    "draft ms/step",
    "target ms/call",
    "c",
    "verify cost",
    "Thm 8 pred.",
    "pred. w/ verify cost",
    "achieved",
    "achieved/pred.",
    "chrF ref",
    "chrF greedy",
)


def _main_row(r: dict) -> list[str]:
    eq = r["equal_to_baseline"]
    eq_text = "-" if eq is None else (_pct(eq) if eq == 1.0 or not r["lossless"] else f"**{_pct(eq)} (!)**")
    speedup = _f(r.get("speedup"), 2, "x")
    if r["runner"] == BASELINE:
        speedup = "1.00x (baseline)"
    return [
        f"`{r['runner']}`",
        "-" if r["gamma"] is None else str(r["gamma"]),
        _f(r["tokens_per_second"], 1),
        speedup,
        _f(r["tokens_per_call"]),
        _f(r["alpha"], 3),
        str(r["target_calls"]),
        str(r["draft_calls"]),
        eq_text,
        overshoot_text(r),
        _f(r.get("draft_ms_per_step"), 1),
        _f(r.get("target_ms_per_call"), 1),
        _f(r["c"], 3),
        _f(r["verify_cost"], 2, "x"),
        _f(r["predicted_speedup"], 2, "x"),
        _f(r["predicted_speedup_with_verify_cost"], 2, "x"),
        _f(r["speedup_vs_ours_autoregressive"], 2, "x") if r["predicted_speedup"] is not None else "-",
        _f(r["achieved_over_predicted"]),
        _f(r["chrf_reference"], 1),
        _f(r["chrf_target_greedy"], 1),
    ]


def overshoot_text(r: dict) -> str:
    """'7 (3/12)': tokens generated past max_new_tokens, on how many of the prompts; '-' when none."""
    if not r["overshoot_tokens"]:
        return "-"
    return f"{r['overshoot_tokens']} ({r['overshoot_prompts']}/{r['prompts']})"


def cost_table(result: dict) -> list[str]:
    """Milliseconds per forward and the cost relative to one token, one column pair per mode."""
    modes, sizes = result["modes"], result["config"]["sizes"]
    rows = []
    for n in sizes:
        row = [str(n)]
        for name in modes:
            ms = {p["n"]: p["median_ms"] for p in modes[name]["points"]}
            row += [f"{ms[n]:.2f}", f"{ms[n] / ms[sizes[0]]:.2f}x" if sizes[0] == 1 else "-"]
        rows.append(row)
    return markdown_table(["n"] + [c for name in modes for c in (f"{name} ms", "x 1 token")], rows)


def _device_text(env: dict) -> str:
    """Where the models ran, the GPU named (runs recorded before devices existed ran on the CPU)."""
    device = env.get("device", "cpu")
    return f"models on {device}" + (f" ({env['gpu']})" if env.get("gpu") else "") + "; "


def _llama_cpp_lines(cfg: dict, ver: dict) -> list[str]:
    """Which llama.cpp library the llama.cpp rows ran on and what its kernels mean for exactness (none: no such row)."""
    library = ver.get("llama_cpp_library")
    if library is None:
        return []
    from ..backends.llamacpp_kernels import describe_library

    return [f"llama.cpp library: {describe_library(library, cfg.get('flash_attn'))}.", ""]


def render_markdown(result: dict) -> str:
    cfg, env, ver = result["config"], result["machine"], result["versions"]
    rows = result["runners"]
    files = result["files"]
    commit = (ver.get("git_commit") or "unknown")[:12] + (" (uncommitted changes)" if ver.get("git_dirty") else "")
    temps = ", ".join("0 (greedy)" if t == 0 else f"{t:g}" for t in cfg["temperatures"])
    lines = [
        f"# draftverify bench: {cfg['prompts']}" + (" (--quick smoke run)" if cfg["quick"] else ""),
        "",
        f"{len(result['prompts'])} prompts, up to {cfg['max_new_tokens']} new tokens, batch 1, temperatures {temps}. "
        f"{result['date']}; {env['cpu_model']} ({env['cores']} cores, torch threads {ver['torch_threads']}); "
        + _device_text(env)
        + f"python {ver['python']}, torch {ver['torch']}, transformers {ver['transformers']}, "
        f"draftverify {ver['draftverify']}, commit {commit}.",
        "",
        _compile_line(cfg),
        "",
        *_llama_cpp_lines(cfg, ver),
        *command_block(
            "Reproduce (from the repository root; models and data as recorded in the JSON):", result["reproduce"]
        ),
        "",
        f"Recorded command line: `{result['command']}`",
        "",
    ]
    for warning in result["warnings"]:
        lines += [f"> **WARNING**: {warning}", ""]
    lines += [
        "How to read: every runner ran in this one process on the same token ids, prompt-major (each prompt through "
        "every runner, the order rotated per prompt) after one warm-up generation each; wall time is perf_counter "
        "around the whole generate call; all stop at the tokenizer's EOS. **tok/s** = total new tokens / total "
        f"seconds; **speedup** = tok/s over `{BASELINE}` (the target alone, HF generate, KV cache) at the same "
        "temperature. **tokens/call** = new tokens per target forward that emits tokens (ours: after the prefill). "
        "**alpha** = accepted / judged draft tokens. **= baseline**: share of prompts whose greedy output equals "
        "the baseline's token for token, compared up to max_new_tokens. **overshoot**: tokens generated past "
        "max_new_tokens (Hugging Face prompt lookup keeps a whole accepted draft) and on how many prompts; they are "
        "cut before every other column, tok/s included. "
        "**draft ms/step** and **target ms/call** = our loop's timers per step: proposing the draft (draft model, "
        "heads, lattice or neural rescoring) and the target's verify forward; a drafter pays for itself when its "
        "time is small beside the target's. "
        f"**c** = seconds per drafter run / seconds per single-token target forward "
        f"(Leviathan Definition 7; our timers, the single-token forward from `{OURS_BASELINE}`; model-free drafters: "
        "per drafted position). **verify cost** = seconds per verification forward over gamma+1 tokens / seconds "
        "per single-token forward: Theorem 8 assumes 1x (parallel hardware), a CPU pays more; **pred. w/ verify cost** "
        "= `theory.walltime_factor(alpha, gamma, c, verify_cost)`, Theorem 8 with that measured cost. **Thm 8 pred.** "
        "= `theory.walltime_factor(alpha, gamma, c)` (gamma: the fixed gamma, else the mean draft length); "
        f"**achieved** = tok/s over `{OURS_BASELINE}`, the same loop without drafting. **chrF ref**: completion (cut "
        "at HumanEval's stop sequences) against the reference solution; **chrF greedy**: against the target's own "
        "greedy output.",
        "",
    ]
    for t in cfg["temperatures"]:
        t_rows = [r for r in rows if r["temperature"] == t]
        if not t_rows:
            continue
        lines += [f"## {_temperature_title(t)}", ""]
        lines += markdown_table(MAIN_COLUMNS, [_main_row(r) for r in t_rows])
        lines.append("")
    duels = head_to_head(rows)
    if duels:
        lines += [
            "## Head to head",
            "",
            "Per temperature and backend, our fastest exact row whose every output equals its baseline, beside "
            "each other tool's fastest row (each family at its best setting in this run) and the ratio of "
            "their tok/s.",
            "",
        ]
        lines += markdown_table(("temperature", "ours", "tok/s", "peer", "peer tok/s", "ours / peer"), duels) + [""]
    bild = [r for r in rows if not r["lossless"] and r["kind"] == "ours"]
    if bild:
        lines += [
            "## Lossy methods (BiLD, SpecDec++, ...): quality vs latency (greedy)",
            "",
            "Normalised latency = 1 / speedup (the target alone = 1). For comparison, per temperature: the "
            "baseline, our fastest draft-model runner (at temperature > 0: speculative sampling) and our fastest "
            "lossless runner.",
            "",
        ]
        cols = ("runner", "alpha_FB", "alpha_RB", "speedup", "norm. latency", "tokens/call", "chrF ref", "chrF greedy")
        table_rows = []
        for r in bild + comparison_rows(rows):
            s = r["settings"]
            table_rows.append(
                [
                    f"`{r['runner']}`" + ("" if r["temperature"] == 0 else f" (T={r['temperature']:g})"),
                    f"{s['alpha_fb']:g}" if "alpha_fb" in s else "-",
                    f"{s['alpha_rb']:g}" if "alpha_rb" in s else "-",
                    _f(r.get("speedup"), 2, "x"),
                    _f(1 / r["speedup"] if r.get("speedup") else None, 3),
                    _f(r["tokens_per_call"]),
                    _f(r["chrf_reference"], 1),
                    _f(r["chrf_target_greedy"], 1),
                ]
            )
        lines += markdown_table(cols, table_rows) + [""]
    if result.get("cost_curve"):
        cost = result["cost_curve"]
        lines += [
            "## Cost of scoring n tokens, per backend (this run)",
            "",
            f"The target alone, one forward over n tokens after a {cost['context_tokens']}-token context, batch 1, "
            f"median of {cost['config']['repeats']} calls per width, measured after the runners in the same "
            "process (`bench/cost_run.py`; `x 1 token`: what verifying n tokens costs in decoding steps).",
            "",
        ]
        lines += cost_table(cost) + [""]
    plots = [(k, v) for k, v in files.items() if v.endswith(".png")]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{k}]({Path(v).name})" for k, v in plots]
        lines.append("")
    lines += _warmup_section(result)
    notes = result["notes"]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    lines += [
        f"Every per-prompt measurement (texts, token ids, timings, our time split): `{Path(files['json']).name}`.",
        "",
    ]
    return "\n".join(lines)


def _compile_line(cfg: dict) -> str:
    if cfg.get("compile"):
        return (
            "**Compiled (`--compile`)**: our runners (`ours_autoregressive` and every method row) run the target "
            "and draft models with a preallocated KV cache and torch.compile, one graph per verify-width bucket, "
            "compiled during each runner's warm-up (seconds below, never inside a timed generation); the peers "
            "(Hugging Face, llama.cpp) run as usual."
        )
    return "Eager (no `--compile`): every runner runs the models as loaded."


def _warmup_section(result: dict) -> list[str]:
    """Warm-up seconds per runner (compilation included under --compile), compilations then and while timed."""
    specs = [s for s in result.get("runner_specs", []) if s.get("warmup_seconds") is not None]
    if not specs:
        return []
    compiled = bool(result["config"].get("compile"))
    lines = [
        "## Warm-up" + (" and compilation" if compiled else ""),
        "",
        "Seconds of each runner's warm-up (one generation per temperature, on the first prompt"
        + (
            "; for compiled runners first one forward per width bucket of the target and draft models, so "
            "the first runner to use a shared model pays its compilation; all rows again, up to 3 passes, until "
            "a pass compiles nothing"
            if compiled
            else ""
        )
        + "), outside every timed generation.",
        "",
    ]
    columns = ["runner", "compiled", "warm-up s", "compilations in warm-up", "compilations while timed"]
    rows = [
        [
            f"`{s['name']}`",
            "yes" if s.get("compiled") else "no",
            _f(s["warmup_seconds"], 2),
            str(s.get("warmup_compiles", 0)),
            str(s.get("timed_compiles", 0)) if not s.get("timed_compiles") else f"**{s['timed_compiles']} (!)**",
        ]
        for s in specs
    ]
    return lines + markdown_table(columns, rows) + [""]


def backend_of(runner: str) -> str:
    """Our rows on another backend than HF are named "BACKEND:method"."""
    return runner.split(":", 1)[0] if ":" in runner else "hf"


def head_to_head(rows: list[dict]) -> list[list[str]]:
    """Table rows: per temperature, each backend's fastest exact row of ours (every output equal to its baseline),
    and its fastest `model` row (the draft model alone) when that is another, against each peer family's fastest row
    (Hugging Face assisted generation, llama.cpp's plain, prompt lookup and draft-model decoding, llama.cpp's own
    server per --spec-type list, ...), with ours / peer."""
    out = []
    for t in dict.fromkeys(r["temperature"] for r in rows):
        t_rows = [r for r in rows if r["temperature"] == t and r.get("tokens_per_second")]
        ours = [
            r
            for r in t_rows
            if r["kind"] == "ours"
            and r["lossless"]
            and r["family"] != OURS_BASELINE
            and r["equal_to_baseline"] in (None, 1.0)
        ]
        peers = [r for r in t_rows if r["kind"] != "ours" and r["runner"] != BASELINE]
        best_ours = []
        for backend in dict.fromkeys(backend_of(r["runner"]) for r in ours):
            mine = [r for r in ours if backend_of(r["runner"]) == backend]
            for group in (mine, [r for r in mine if r["family"] == "model"]):
                if group:
                    best = max(group, key=lambda r: r["tokens_per_second"])
                    best_ours += [best] if best not in best_ours else []
        best_peers: dict[str, dict] = {}
        for r in peers:
            group = r.get("group") or r["family"]  # llamacpp_native: one family per llama.cpp --spec-type list
            if group not in best_peers or r["tokens_per_second"] > best_peers[group]["tokens_per_second"]:
                best_peers[group] = r
        for mine in best_ours:
            for peer in best_peers.values():
                out.append(
                    [
                        "0 (greedy)" if t == 0 else f"{t:g}",
                        f"`{mine['runner']}`",
                        _f(mine["tokens_per_second"], 1),
                        f"`{peer['runner']}`",
                        _f(peer["tokens_per_second"], 1),
                        _f(mine["tokens_per_second"] / peer["tokens_per_second"], 2, "x"),
                    ]
                )
    return out


def comparison_rows(rows: list[dict]) -> list[dict]:
    """Per temperature: the baseline, our fastest draft-model row (speculative sampling at temperature > 0) and
    our fastest lossless drafting row if that is another one."""
    out = []
    for t in dict.fromkeys(r["temperature"] for r in rows):
        t_rows = [r for r in rows if r["temperature"] == t]
        out += [r for r in t_rows if r["runner"] == BASELINE]
        ours = [
            r
            for r in t_rows
            if r["kind"] == "ours" and r["lossless"] and r["family"] != OURS_BASELINE and r.get("speedup") is not None
        ]
        picks = [
            max(group, key=lambda r: r["speedup"])
            for group in ([r for r in ours if r["family"] == "model"], ours)
            if group
        ]
        out += [r for i, r in enumerate(picks) if r not in picks[:i]]
    return out
