"""`draftverify reproduce specdec`: SpecDec's and BiLD's translation experiments on one encoder-decoder pair.

One run decodes the same source sentences (Multi30k test_2016_flickr by default) with every row, sentence by
sentence and rows rotated per sentence (so drift on a shared machine spreads over all rows):

* baselines: HF `generate` greedy (AT greedy) and beam search (AT beam), our loop without drafting;
* `hf_assisted[g]`: HF assisted generation with the small model as assistant (the same pair as ours);
* `specdec[k]`: the NAT drafter under greedy verification, one row per block size k (SpecDec Table 2);
* `specdec++[k,beta,tau]`: the NAT drafter under top-beta / tau (SpecDec Table 3's grid);
* `model[g]`: the small model as a Leviathan draft (lossless; BiLD 4.2's speculative-sampling comparison);
* `bild[fb,rb]`: the small model under fallback / rollback over a threshold grid (BiLD Figure 4);
* `model_aligned[g]`, `bild_aligned[fb,rb]`: the same with the aligned small model (BiLD 3.5.1: fine-tuned on the
  large model's greedy translations), when one is given: the before / after of prediction alignment.

Per row: corpus BLEU / chrF against the references (sacrebleu), the share of sentences identical to AT greedy,
mean tokens per target call (SpecDec's "Tok."), large- and small-model calls per sentence, mean seconds per
sentence and the speedup over HF greedy, and our loop's time split (prefill = the encoders, drafter, verifier
forward, the rest: SpecDec Table 18). ``counts_only`` drops every timing (for a busy machine, where they mean
nothing) and the HF assisted rows (they measure time only). Writes <out>/<name>.json and <name>.md (and
<name>-bild.png: BLEU against latency, or against large-model calls per sentence when counts only).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Callable

import torch

from ..backends.hf.cached_lm import CachedLM
from ..bench.prompts import Prompt
from ..drafters.base import Drafter
from ..errors import DraftVerifyError
from ..loop import generate
from ..markdown import markdown_table
from ..methods import MethodOptions, build_drafter, build_verifier
from ..types import SamplingParams

GREEDY = SamplingParams()
TIME_PARTS = ("time_prefill", "time_draft", "time_target", "time_verify", "time_other")


@dataclass
class Row:
    name: str
    family: str
    lossless: bool
    settings: dict
    run: Callable[[torch.Tensor, int], tuple[list[int], dict | None]]  # ids [1, S], max new -> (new ids, stats)
    texts: list[str] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)


def _strip(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def hf_row(
    name: str, model, eos: int, settings: dict, assistant_settings: dict | None = None, **generate_kwargs
) -> Row:
    def run(ids: torch.Tensor, max_new: int):
        for key, value in (assistant_settings or {}).items():  # the assistant's own config: set on every call
            setattr(generate_kwargs["assistant_model"].generation_config, key, value)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
            **generate_kwargs,
        )
        return out[0, 1:].tolist(), None  # after the decoder start token

    return Row(name, name.split("[")[0], lossless=settings.get("num_beams", 1) == 1, settings=settings, run=run)


def ours_row(
    name: str,
    family: str,
    target: CachedLM,
    drafter: Drafter,
    verifier: str,
    options: MethodOptions,
    gamma: int,
    eos: int,
    settings: dict,
) -> Row:
    v = build_verifier(verifier, GREEDY, options)

    def run(ids: torch.Tensor, max_new: int):
        out = generate(target, drafter, v, ids, GREEDY, max_new_tokens=max_new, gamma=gamma, eos_token_id=eos)
        return out.new_tokens[0].tolist(), out.stats.as_dict()

    return Row(name, family, lossless=verifier == "exact", settings=settings, run=run)


def _grid(values: str, cast) -> list:
    try:
        return [cast(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise DraftVerifyError(f"expected a comma list, got {values!r}") from None


ALIGNED_SUFFIX = "_aligned"


def small_model_rows(
    target: CachedLM,
    target_model,
    draft_model,
    suffix: str,
    eos: int,
    gammas: list[int],
    fbs: list[float],
    rbs: list[float],
    bild_gamma: int,
    hf_assisted: bool,
) -> list[Row]:
    """One small model's rows: HF assisted (optional), the Leviathan draft per gamma, BiLD per (fb, rb)."""
    small = CachedLM(draft_model, role="draft")
    rows = []
    for g in gammas:
        if hf_assisted:
            assistant = {
                "num_assistant_tokens": g,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            }
            rows.append(
                hf_row(
                    f"hf_assisted{suffix}[g={g}]",
                    target_model,
                    eos,
                    {"gamma": g},
                    assistant,
                    assistant_model=draft_model,
                )
            )
        rows.append(
            ours_row(
                f"model{suffix}[g={g}]",
                f"model{suffix}",
                target,
                build_drafter("model", target, MethodOptions(draft_model=small)),
                "exact",
                MethodOptions(),
                g,
                eos,
                {"gamma": g},
            )
        )
    for fb, rb in itertools.product(fbs, rbs):
        o = MethodOptions(draft_model=small, alpha_fb=fb, alpha_rb=rb)
        settings = {"alpha_fb": fb, "alpha_rb": rb, "max_draft": bild_gamma}
        drafter = build_drafter("model", target, o)
        rows.append(
            ours_row(
                f"bild{suffix}[fb={fb:g},rb={rb:g}]",
                f"bild{suffix}",
                target,
                drafter,
                "bild",
                o,
                bild_gamma,
                eos,
                settings,
            )
        )
    return rows


def build_rows(
    target_model,
    draft_model,
    nat_path,
    eos: int,
    ks: list[int],
    betas: list[int],
    taus: list[float],
    plus_k: int,
    gammas: list[int],
    fbs: list[float],
    rbs: list[float],
    bild_gamma: int,
    beams: int,
    aligned_model=None,
    counts_only: bool = False,
) -> tuple[list[Row], list[str]]:
    target = CachedLM(target_model, role="target")
    notes: list[str] = []
    rows = [
        hf_row("hf_greedy", target_model, eos, {}),
        hf_row(f"hf_beam[b={beams}]", target_model, eos, {"num_beams": beams}, num_beams=beams, early_stopping=True),
        ours_row(
            "autoregressive",
            "autoregressive",
            target,
            build_drafter("none", target, MethodOptions()),
            "exact",
            MethodOptions(),
            1,
            eos,
            {},
        ),
    ]
    if nat_path is not None:
        options = MethodOptions(nat_path=nat_path)
        nat = build_drafter("nat", target, options)
        rows += [ours_row(f"specdec[k={k}]", "specdec", target, nat, "exact", options, k, eos, {"k": k}) for k in ks]
        for beta, tau in itertools.product(betas, taus):
            o = MethodOptions(nat_path=nat_path, beta=beta, tau=tau)
            settings = {"k": plus_k, "beta": beta, "tau": tau}
            name = f"specdec++[k={plus_k},b={beta},t={tau:g}]"
            rows.append(ours_row(name, "specdec++", target, nat, "topbeta", o, plus_k, eos, settings))
    else:
        notes.append("no NAT drafter: specdec rows skipped")
    grid = dict(gammas=gammas, fbs=fbs, rbs=rbs, bild_gamma=bild_gamma, hf_assisted=not counts_only)
    if draft_model is not None:
        rows += small_model_rows(target, target_model, draft_model, "", eos, **grid)
    else:
        notes.append("no small model: hf_assisted, model and bild rows skipped")
    if aligned_model is not None:
        rows += small_model_rows(
            target, target_model, aligned_model, ALIGNED_SUFFIX, eos, **{**grid, "hf_assisted": False}
        )
    if counts_only:
        notes.append("counts only: no timings; hf_assisted rows skipped (they measure time only)")
    return rows, notes


def _summary(row: Row, refs: list[str], greedy_ids: list[list[int]], base_seconds: float | None, eos: int) -> dict:
    """One row's figures; seconds, speedup and time split only when the run was timed (base_seconds given)."""
    import sacrebleu

    n = len(row.texts)
    out = {
        "name": row.name,
        "family": row.family,
        "lossless": row.lossless,
        "settings": row.settings,
        "bleu": round(sacrebleu.corpus_bleu(row.texts, [refs[:n]]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(row.texts, [refs[:n]]).score, 2),
        "same_as_greedy": sum(_strip(a, eos) == _strip(b, eos) for a, b in zip(row.ids, greedy_ids)) / max(n, 1),
    }
    if base_seconds is not None:
        out["seconds_per_sentence"] = sum(row.seconds) / max(n, 1)
        out["speedup_vs_hf_greedy"] = (
            base_seconds / out["seconds_per_sentence"] if out["seconds_per_sentence"] else None
        )
    if row.stats:
        calls = sum(s["target_calls"] for s in row.stats)
        out["tokens_per_call"] = sum(s["new_tokens"] for s in row.stats) / max(calls, 1)
        out["accepted_per_call"] = sum(s["accepted_tokens"] for s in row.stats) / max(calls, 1)
        # BiLD's cost in counts: large-model calls (after the encoder pass) and small-model calls per sentence
        out["target_calls_per_sentence"] = calls / len(row.stats)
        out["draft_calls_per_sentence"] = sum(s["draft_calls"] for s in row.stats) / len(row.stats)
        if base_seconds is not None:
            total = sum(s["time_total"] for s in row.stats) or 1.0
            out["time_split"] = {k.replace("time_", ""): sum(s[k] for s in row.stats) / total for k in TIME_PARTS}
            # what one decoding step costs (the encoder pass aside): with tokens per call this sets the speed
            draft_calls = sum(s["draft_calls"] for s in row.stats)
            out["ms_per_step"] = 1e3 * (total - sum(s["time_prefill"] for s in row.stats)) / max(calls, 1)
            out["ms_per_verifier_call"] = 1e3 * sum(s["time_target"] for s in row.stats) / max(calls, 1)
            out["ms_per_drafter_call"] = (
                1e3 * sum(s["time_draft"] for s in row.stats) / draft_calls if draft_calls else None
            )
    return out


def tokens_per_call_needed(row: dict, ar_ms_per_token: float, speedup: float = 2.0) -> float:
    """The tokens per call at which `row`'s measured step cost would run `speedup` x our autoregressive loop:
    speedup x (ms per step) / (AR ms per token). Above the measured tokens per call, the drafts are too short for
    what a step costs; the gap says whether acceptance or cost is the lever."""
    return speedup * row["ms_per_step"] / ar_ms_per_token


def run_sweep(
    target_model,
    draft_model,
    nat_path,
    tokenizer,
    prompts: list[Prompt],
    max_new_tokens: int,
    log: Callable[[str], None] = print,
    aligned_model=None,
    counts_only: bool = False,
    **grid,
) -> dict:
    eos = tokenizer.eos_token_id
    for role, model in (("--draft", draft_model), ("--aligned-draft", aligned_model)):
        if model is not None and model.config.vocab_size != target_model.config.vocab_size:
            raise DraftVerifyError(
                f"{role} model has vocab_size {model.config.vocab_size} but the target has "
                f"{target_model.config.vocab_size}: the small model must use the target's tokenizer"
            )
    rows, notes = build_rows(
        target_model, draft_model, nat_path, eos, aligned_model=aligned_model, counts_only=counts_only, **grid
    )
    sources = [tokenizer(p.text, return_tensors="pt").input_ids for p in prompts]
    with torch.inference_mode():
        if not counts_only:
            rows[0].run(sources[0], 4)  # warm-up: first-call allocations are no row's cost
        for i, ids in enumerate(sources):
            shift = i % len(rows)
            for row in rows[shift:] + rows[:shift]:
                started = perf_counter()
                new, stats = row.run(ids, max_new_tokens)
                row.seconds.append(perf_counter() - started)
                row.ids.append(new)
                row.texts.append(tokenizer.decode(_strip(new, eos), skip_special_tokens=True).strip())
                if stats is not None:
                    row.stats.append(stats)
            if (i + 1) % 10 == 0 or i + 1 == len(sources):
                log(f"{i + 1}/{len(sources)} sentences")
    refs = [p.reference or "" for p in prompts]
    greedy_ids = rows[0].ids
    base = None if counts_only else sum(rows[0].seconds) / max(len(rows[0].seconds), 1)
    summaries = [_summary(r, refs, greedy_ids, base, eos) for r in rows]
    return {
        "rows": summaries,
        "notes": notes,
        "counts_only": counts_only,
        "aligned": aligned_comparison(summaries),
        "sentences": len(prompts),
        "max_new_tokens": max_new_tokens,
        "examples": [
            {"source": prompts[0].text, "reference": prompts[0].reference, **{r.name: r.texts[0] for r in rows}}
        ]
        if prompts
        else [],
    }


def aligned_comparison(rows: list[dict]) -> dict:
    """Before / after prediction alignment: each small-model row beside its `_aligned` twin (same settings), and per
    small model the fewest large-model calls per sentence among its BiLD rows at no BLEU loss against AT greedy and
    within one BLEU point (BiLD Table 1's two operating points). Empty without aligned rows."""
    by_name = {r["name"]: r for r in rows}
    keys = ("bleu", "tokens_per_call", "target_calls_per_sentence", "draft_calls_per_sentence", "same_as_greedy")
    pairs = [
        {"row": r["name"], "settings": r["settings"], **{k: [r.get(k), twin.get(k)] for k in keys}}
        for r in rows
        for twin in [by_name.get(r["name"].replace("[", ALIGNED_SUFFIX + "[", 1))]
        if r["family"] in ("model", "bild") and twin is not None
    ]
    if not pairs:
        return {}
    greedy = next(r["bleu"] for r in rows if r["family"] in ("hf_greedy", "autoregressive"))
    frontier = {}
    for family in ("bild", "bild" + ALIGNED_SUFFIX):
        points = [r for r in rows if r["family"] == family]
        frontier[family] = {
            label: min((r["target_calls_per_sentence"] for r in points if r["bleu"] >= greedy - loss), default=None)
            for label, loss in (("no_loss", 0.0), ("within_1_bleu", 1.0))
        }
    return {"pairs": pairs, "greedy_bleu": greedy, "fewest_target_calls": frontier}


def _table(rows: list[dict], columns: list[tuple[str, str, Callable]]) -> list[str]:
    """The sweep's table: one column a (header, the row's key, its format), '-' where a row has no value."""
    cells = [[show(r[key]) if r.get(key) is not None else "-" for _, key, show in columns] for r in rows]
    return markdown_table([c[0] for c in columns], cells)


def _aligned_lines(aligned: dict) -> list[str]:
    f2 = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    both = lambda pair: f"{f2(pair[0])} / {f2(pair[1])}"  # noqa: E731
    lines = [
        "## Prediction alignment: original / aligned small model (BiLD 3.5.1)",
        "",
    ]
    keys = ("bleu", "target_calls_per_sentence", "draft_calls_per_sentence", "tokens_per_call")
    pairs = [
        (
            f"`{p['row']}`",
            *(both(p[k]) for k in keys),
            "{:.0f}% / {:.0f}%".format(*(100 * x for x in p["same_as_greedy"])),
        )
        for p in aligned["pairs"]
    ]
    columns = ("row", "BLEU", "large-model calls / sentence", "small-model calls / sentence", "tokens / target call")
    lines += markdown_table((*columns, "same as AT greedy"), pairs)
    fewest = aligned["fewest_target_calls"]
    lines += [
        "",
        f"Fewest large-model calls per sentence among the BiLD rows (AT greedy BLEU {aligned['greedy_bleu']:.2f}):",
        "",
    ]
    lines += markdown_table(
        ("small model", "at no BLEU loss", "within 1 BLEU"),
        [
            (label, f2(fewest[family]["no_loss"]), f2(fewest[family]["within_1_bleu"]))
            for family, label in (("bild", "original"), ("bild" + ALIGNED_SUFFIX, "aligned"))
        ],
    )
    return lines + [""]


def render_markdown(result: dict) -> str:
    f2 = lambda v: f"{v:.2f}"  # noqa: E731
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    rows = result["rows"]
    timed = not result.get("counts_only")
    columns = [
        ("row", "name", lambda v: f"`{v}`"),
        ("BLEU", "bleu", f2),
        ("chrF", "chrf", f2),
        ("same as AT greedy", "same_as_greedy", pct),
        ("tokens / target call", "tokens_per_call", f2),
        ("large-model calls / sentence", "target_calls_per_sentence", f2),
        ("small-model calls / sentence", "draft_calls_per_sentence", f2),
    ]
    if timed:
        columns += [
            ("s / sentence", "seconds_per_sentence", lambda v: f"{v:.4f}"),
            ("speedup vs HF greedy", "speedup_vs_hf_greedy", lambda v: f"{v:.2f}x"),
        ]
    lines = [
        f"# {result['name']}",
        "",
        f"Command: `{result['command']}`",
        "",
        f"{result['sentences']} sentences of {result['prompts']}, at most {result['max_new_tokens']} new tokens, "
        f"{result['threads']} thread(s), {result['machine']}; {result['date']}"
        + ("; counts only (no timings)." if not timed else "."),
        "",
        *_table(rows, columns),
        "",
    ]
    if result.get("aligned"):
        lines += _aligned_lines(result["aligned"])
    split = [r for r in rows if r.get("time_split")]
    if split:
        lines += [
            "## Where the time goes (our loop; SpecDec Table 18)",
            "",
            *markdown_table(
                ("row", "encoders (prefill)", "drafter", "verifier forward", "verify rule", "other"),
                [
                    (
                        f"`{r['name']}`",
                        *(pct(r["time_split"][k]) for k in ("prefill", "draft", "target", "verify", "other")),
                    )
                    for r in split
                ],
            ),
            "",
        ]
        lines += _step_cost_lines(split)
    if result["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in result["notes"]], ""]
    return "\n".join(lines)


def _step_cost_lines(rows: list[dict]) -> list[str]:
    """Per-step costs against our autoregressive step, and the tokens per call 2.0x would need at that cost."""
    ar = next((r for r in rows if r["name"] == "autoregressive" and r.get("ms_per_step")), None)
    if ar is None:
        return []
    a = ar["ms_per_step"]  # one token per call: ms per token
    lines = [
        "## What a step costs (ms, the encoder pass aside) and what 2.0x would need",
        "",
        f"Our autoregressive loop: {a:.2f} ms per token. A row runs 2.0x that loop when its tokens per call reach "
        "2.0 x (ms per step) / (AR ms per token).",
        "",
    ]
    cells = [
        (f"`{r['name']}`", f"{r['ms_per_step']:.2f}", f"{r['ms_per_verifier_call']:.2f}")
        + ("-" if r.get("ms_per_drafter_call") is None else f"{r['ms_per_drafter_call']:.2f}",)
        + (f"{r['tokens_per_call']:.2f}", f"{tokens_per_call_needed(r, a):.2f}")
        for r in rows
        if r["name"] != "autoregressive" and r.get("ms_per_step")
    ]
    columns = ("row", "ms / step", "ms / verifier call", "ms / drafter call", "tokens / call", "tokens / call for 2.0x")
    return lines + markdown_table(columns, cells) + [""]


PLOT_FAMILIES = (
    ("bild", "o"),
    ("bild" + ALIGNED_SUFFIX, "o"),
    ("model", "s"),
    ("model" + ALIGNED_SUFFIX, "s"),
    ("specdec", "^"),
    ("hf_greedy", "*"),
    ("autoregressive", "x"),
    ("hf_beam", "D"),
)


def plot_bild(rows: list[dict], path: Path, counts_only: bool = False) -> Path | None:
    """BLEU against ms per sentence (or, counts only, large-model calls per sentence): BiLD rows as a curve per
    small model, the baselines as points (BiLD Figure 4)."""
    key = "target_calls_per_sentence" if counts_only else "seconds_per_sentence"
    points = [r for r in rows if r.get(key) is not None]
    if not any(r["family"] == "bild" for r in points):
        return None
    from ..bench.plots import pyplot, save_figure

    plt = pyplot()

    scale = 1 if counts_only else 1000
    fig, ax = plt.subplots(figsize=(6, 4))
    for family, marker in PLOT_FAMILIES:
        sel = sorted((r for r in points if r["family"] == family), key=lambda r: r[key])
        if not sel:
            continue
        xs, ys = [r[key] * scale for r in sel], [r["bleu"] for r in sel]
        if family.startswith("bild"):
            ax.plot(xs, ys, marker=marker, linestyle="-", linewidth=0.8, label=family)
        else:
            ax.scatter(xs, ys, marker=marker, label=family)
    ax.set_xlabel("large-model calls per sentence" if counts_only else "ms per sentence")
    ax.set_ylabel("BLEU (test)")
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=120)


def write(result: dict, out: Path, name: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / f"{name}.json"), "markdown": str(out / f"{name}.md")}
    png = plot_bild(result["rows"], out / f"{name}-bild.png", result.get("counts_only", False))
    if png is not None:
        files["bild_png"] = str(png)
    result["files"] = files
    Path(files["json"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
    Path(files["markdown"]).write_text(render_markdown(result))
    return files
