"""PNG plots (matplotlib, Agg): speedup per runner, tokens per call vs gamma (ours vs HF), BiLD quality/latency,
BiTA tokens per call vs its prompt and mask counts."""

from __future__ import annotations

from pathlib import Path

from ..theory import expected_tokens_per_call
from .report import comparison_rows
from .summary import BASELINE

COLORS = {
    "hf_generate": "#000000",
    "ours_autoregressive": "#888888",
    "model": "#1f77b4",
    "hf_assisted": "#1f77b4",
    "prompt_lookup": "#ff7f0e",
    "hf_prompt_lookup": "#ff7f0e",
    "model_aligned": "#2ca02c",
    "ngram": "#9467bd",
    "early_exit": "#8c564b",
    "bild": "#d62728",
    "llamacpp": "#e377c2",
    "llamacpp_prompt_lookup": "#ff7f0e",
    "llamacpp_draft": "#1f77b4",
}


def pyplot():
    """matplotlib.pyplot on the Agg backend: files only, no display needed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, title: str | None = None, dpi: int = 110) -> Path:
    """fig with `title` above its panels (None: no title), laid out and written to path as a PNG at dpi, then closed
    (pyplot holds every figure until it is closed); returns path."""
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def _temps(rows: list[dict]) -> list[float]:
    return list(dict.fromkeys(r["temperature"] for r in rows))


def _t_label(t: float) -> str:
    return "greedy" if t == 0 else f"temperature {t:g}"


def plot_speedup(rows: list[dict], path: Path, title: str) -> Path:
    plt = pyplot()
    temps = _temps(rows)
    longest = max(sum(r["temperature"] == t for r in rows) for t in temps)
    fig, axes = plt.subplots(1, len(temps), figsize=(6.5 * len(temps), 1.2 + 0.24 * longest), squeeze=False)
    for ax, t in zip(axes[0], temps):
        t_rows = [r for r in rows if r["temperature"] == t and r.get("speedup") is not None]
        names = [r["runner"] for r in t_rows]
        ax.barh(
            range(len(t_rows)),
            [r["speedup"] for r in t_rows],
            color=[COLORS.get(r["family"], "#17becf") for r in t_rows],
            hatch=None,
            edgecolor=["black" if r["kind"] != "ours" else "none" for r in t_rows],
        )
        ax.set_yticks(range(len(t_rows)), names, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"speedup over {BASELINE} (tokens/s ratio)")
        ax.set_title(_t_label(t))
        ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path, f"{title}: speedup per runner (black edge: peers, Hugging Face and llama.cpp)")


def _curves(rows: list[dict]) -> dict[str, list[dict]]:
    """Fixed-gamma rows grouped into one curve per family (early exit: per layer count)."""
    curves: dict[str, list[dict]] = {}
    for r in rows:
        if not isinstance(r["gamma"], int) or r["family"] == "bild" or r["tokens_per_call"] is None:
            continue
        key = r["family"] + (f" L={r['settings']['layers']}" if r["family"] == "early_exit" else "")
        curves.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda r: r["gamma"]) for k, v in curves.items()}


def plot_tokens_per_call(rows: list[dict], path: Path, title: str) -> Path:
    plt = pyplot()
    temps = _temps(rows)
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4.5), squeeze=False)
    for ax, t in zip(axes[0], temps):
        curves = _curves([r for r in rows if r["temperature"] == t])
        for n, (key, pts) in enumerate(curves.items()):
            family = pts[0]["family"]
            hf = family.startswith("hf_")
            ax.plot(
                [r["gamma"] for r in pts],
                [r["tokens_per_call"] for r in pts],
                linestyle="--" if hf else "-",
                marker="s" if hf else "o^vD<>"[n % 6],
                color=COLORS.get(family),
                label=key + (" (HF)" if hf else " (ours)"),
            )
            if family == "model":  # Leviathan eq. 1 at each point's measured alpha
                ax.plot(
                    [r["gamma"] for r in pts],
                    [expected_tokens_per_call(r["alpha"] or 0.0, r["gamma"]) for r in pts],
                    linestyle=":",
                    color=COLORS["model"],
                    label="model: eq. 1 at measured alpha",
                )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("gamma (draft length)")
        ax.set_ylabel("mean tokens per target call")
        ax.set_title(_t_label(t))
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=7)
    return save_figure(fig, path, f"{title}: tokens per target call vs gamma, ours (solid) vs Hugging Face (dashed)")


def plot_bild(rows: list[dict], path: Path, title: str) -> Path:
    """BiLD Figure 4: quality vs normalised latency (1 / speedup) over the (alpha_FB, alpha_RB) grid."""
    plt = pyplot()
    bild = [r for r in rows if r["family"] == "bild" and r.get("speedup")]
    metrics = [
        (k, label)
        for k, label in (
            ("chrf_reference", "chrF vs reference solution"),
            ("chrf_target_greedy", "chrF vs the target's greedy output"),
        )
        if any(r[k] is not None for r in rows)
    ]
    fig, axes = plt.subplots(1, max(1, len(metrics)), figsize=(6 * max(1, len(metrics)), 4.5), squeeze=False)
    cmap = plt.get_cmap("viridis")
    rbs = sorted({r["settings"]["alpha_rb"] for r in bild})
    for ax, (key, label) in zip(axes[0], metrics):
        for i, rb in enumerate(rbs):
            pts = sorted(
                (r for r in bild if r["settings"]["alpha_rb"] == rb and r[key] is not None),
                key=lambda r: r["settings"]["alpha_fb"],
            )
            if not pts:
                continue
            colour = cmap(i / max(1, len(rbs) - 1))
            ax.plot(
                [1 / r["speedup"] for r in pts],
                [r[key] for r in pts],
                marker="o",
                color=colour,
                label=f"BiLD alpha_RB={rb:g}",
            )
            for r in pts:
                ax.annotate(
                    f"{r['settings']['alpha_fb']:g}",
                    (1 / r["speedup"], r[key]),
                    fontsize=6,
                    textcoords="offset points",
                    xytext=(3, 3),
                )
        for r in comparison_rows(rows):
            if r[key] is None or not r.get("speedup"):
                continue
            marker = "x" if r["temperature"] == 0 else "^"
            ax.scatter(
                [1 / r["speedup"]],
                [r[key]],
                marker=marker,
                color=COLORS.get(r["family"], "#17becf"),
                zorder=3,
                label=f"{r['runner']} ({_t_label(r['temperature'])})",
            )
        ax.axvline(1.0, color="grey", linewidth=0.6, linestyle="--")
        ax.set_xlabel("normalised latency (1 / speedup; target alone = 1)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return save_figure(fig, path, f"{title}: BiLD quality vs latency (numbers: alpha_FB)")


def plot_bita_counts(rows: list[dict], path: Path, title: str) -> Path:
    """BiTA Figures 8-9: tokens per target call against P (prompt-count rows) and M (mask-count rows) of reproduce bita,
    the mean verify width on a second axis (what the extra tokens per call cost in positions scored)."""
    plt = pyplot()
    panels = [
        (t, key, label)
        for t, key, label in (
            ("prompt-count", "num_prompts", "prompt tokens P"),
            ("mask-count", "num_masks", "mask tokens M"),
        )
        if any(r["table"] == t for r in rows)
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (table, key, label) in zip(axes[0], panels):
        pts = sorted((r for r in rows if r["table"] == table), key=lambda r: r[key])
        xs = [r[key] for r in pts]
        ax.plot(xs, [r["tokens_per_call"] for r in pts], marker="o", color="#1f77b4", label="tokens / call")
        ax.set_xlabel(label)
        ax.set_ylabel("tokens per target call", color="#1f77b4")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        width = ax.twinx()
        width.plot(xs, [r["mean_verify_width"] for r in pts], marker="s", linestyle="--", color="#888888")
        width.set_ylabel("verify width (positions per call)", color="#888888")
    return save_figure(fig, path, f"{title}: tokens per call vs prompt and mask tokens (greedy, efficient tree)")
