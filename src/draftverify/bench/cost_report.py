"""Markdown and PNG for the cost curve: milliseconds per forward against the number of scored tokens, per mode."""

from __future__ import annotations

from pathlib import Path

from ..markdown import command_block, markdown_table
from .cost import REFERENCE_MODE
from .report import cost_table


def _by_n(entry: dict) -> dict[int, float]:
    return {p["n"]: p["median_ms"] for p in entry["points"]}


def render_cost_markdown(result: dict) -> str:
    cfg, env, ver = result["config"], result["machine"], result["versions"]
    modes = result["modes"]
    names = list(modes)
    lines = [
        f"# Cost of one target forward scoring n tokens ({result['label']}: `{result['target']}`)",
        "",
        f"{result['context_tokens']}-token context, Hugging Face StaticCache, batch 1; median of {cfg['repeats']} "
        f"timed calls per width after {cfg['warmup']} untimed (the first compiles). {result['date']}; "
        f"{env['cpu_model']} ({env['cores']} cores, torch threads {ver['torch_threads']}); torch {ver['torch']}, "
        f"transformers {ver['transformers']}.",
        "",
        *command_block("Reproduce:", result["reproduce"]),
        "",
        "Modes: eager = the model's own forward; compiled = `torch.compile(fullgraph=True, dynamic=False)` with "
        "`torch._inductor.config.freezing = True` (one static graph per width). **x 1 token** = the forward's time "
        "over the same mode's one-token forward: what a draft or tree of n tokens costs to verify, in decoding "
        "steps.",
        "",
        "## Milliseconds per forward (median)",
        "",
    ]
    lines += cost_table(result) + [""]
    lines += [
        f"## Greedy equality with {REFERENCE_MODE}",
        "",
        f"{result['equality_prompts']} prompts of `{cfg['prompts']}`, {cfg['equality_tokens']} greedy tokens "
        "each (eager prefill, then one token per forward in the mode). First mismatch: token index where a "
        "prompt's output first differs (- = identical).",
        "",
    ]
    eq_rows = []
    for name in names:
        eq = modes[name]["equality"]
        first = "-" if eq is None else ", ".join("-" if m is None else str(m) for m in eq["first_mismatch"])
        compile_s = sum(modes[name]["first_call_seconds"].values())
        eq_rows.append(
            [
                name,
                "-" if eq is None else f"{100 * eq['equal_rate']:.0f}%",
                first,
                f"{compile_s:.1f}" if modes[name]["compiled"] else "-",
            ]
        )
    lines += markdown_table(["mode", "equal", "first mismatch per prompt", "first calls (compile) s"], eq_rows) + [""]
    if result["files"].get("png"):
        lines += [f"![cost curve]({Path(result['files']['png']).name})", ""]
    if result["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    lines += [f"Every timed call: `{Path(result['files']['json']).name}`.", ""]
    return "\n".join(lines)


def plot_cost(result: dict, path: Path) -> Path:
    from .plots import pyplot, save_figure

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, entry in result["modes"].items():
        ms = _by_n(entry)
        sizes = sorted(ms)
        style = "-" if entry["compiled"] else "--"
        marker = "o" if entry["dtype"] == "float32" else "s"
        left.plot(sizes, [ms[n] for n in sizes], style, marker=marker, label=name)
        right.plot(sizes, [ms[n] / ms[sizes[0]] for n in sizes], style, marker=marker, label=name)
    left.set_xlabel("tokens scored in one forward (n)")
    left.set_ylabel("ms per forward (median)")
    right.set_xlabel("tokens scored in one forward (n)")
    right.set_ylabel(f"cost relative to n={min(p['n'] for e in result['modes'].values() for p in e['points'])}")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(
        fig, path, f"{result['label']}: cost of scoring n tokens after {result['context_tokens']} tokens"
    )
