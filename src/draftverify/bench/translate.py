"""`draftverify bench-translate`: SpecDec's and BiLD's translation experiments on one encoder-decoder pair.

One run decodes the same source sentences (Multi30k test_2016_flickr by default) with every row, sentence by
sentence and rows rotated per sentence (so drift on a shared machine spreads over all rows):

* baselines: HF `generate` greedy (AT greedy) and beam search (AT beam), our loop without drafting;
* `hf_assisted[g]`: HF assisted generation with the small model as assistant (the same pair as ours);
* `specdec[k]`: the NAT drafter under greedy verification, one row per block size k (SpecDec Table 2);
* `specdec++[k,beta,tau]`: the NAT drafter under top-beta / tau (SpecDec Table 3's grid);
* `model[g]`: the small model as a Leviathan draft (lossless; BiLD 4.2's speculative-sampling comparison);
* `bild[fb,rb]`: the small model under fallback / rollback over a threshold grid (BiLD Figure 4).

Per row: corpus BLEU / chrF against the references (sacrebleu), the share of sentences identical to AT greedy,
mean tokens per target call (SpecDec's "Tok."), mean seconds per sentence and the speedup over HF greedy, and our
loop's time split (prefill = the encoders, drafter, verifier forward, the rest: SpecDec Table 18). Writes
<out>/<name>.json and <name>.md (and <name>-bild.png, BLEU against latency).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Callable

import torch

from ..cached_lm import CachedLM
from ..drafters.base import Drafter
from ..errors import DraftVerifyError
from ..loop import generate
from ..methods import MethodOptions, build_drafter, build_verifier
from ..types import SamplingParams
from .prompts import Prompt

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


def hf_row(name: str, model, eos: int, settings: dict, assistant_settings: dict | None = None, **generate_kwargs) -> Row:
    def run(ids: torch.Tensor, max_new: int):
        for key, value in (assistant_settings or {}).items():  # the assistant's own config: set on every call
            setattr(generate_kwargs["assistant_model"].generation_config, key, value)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos, **generate_kwargs)
        return out[0, 1:].tolist(), None  # after the decoder start token

    return Row(name, name.split("[")[0], lossless=settings.get("num_beams", 1) == 1, settings=settings, run=run)


def ours_row(name: str, family: str, target: CachedLM, drafter: Drafter, verifier: str, options: MethodOptions,
             gamma: int, eos: int, settings: dict) -> Row:
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


def build_rows(target_model, draft_model, nat_path, eos: int, ks: list[int], betas: list[int], taus: list[float],
               plus_k: int, gammas: list[int], fbs: list[float], rbs: list[float], bild_gamma: int, beams: int) -> tuple[list[Row], list[str]]:
    target = CachedLM(target_model, role="target")
    notes: list[str] = []
    rows = [hf_row("hf_greedy", target_model, eos, {}),
            hf_row(f"hf_beam[b={beams}]", target_model, eos, {"num_beams": beams}, num_beams=beams, early_stopping=True),
            ours_row("autoregressive", "autoregressive", target, build_drafter("none", target, MethodOptions()),
                     "exact", MethodOptions(), 1, eos, {})]
    if nat_path is not None:
        options = MethodOptions(nat_path=nat_path)
        nat = build_drafter("nat", target, options)
        rows += [ours_row(f"specdec[k={k}]", "specdec", target, nat, "exact", options, k, eos, {"k": k}) for k in ks]
        for beta in betas:
            for tau in taus:
                o = MethodOptions(nat_path=nat_path, beta=beta, tau=tau)
                rows.append(ours_row(f"specdec++[k={plus_k},b={beta},t={tau:g}]", "specdec++", target, nat, "topbeta",
                                     o, plus_k, eos, {"k": plus_k, "beta": beta, "tau": tau}))
    else:
        notes.append("no NAT drafter: specdec rows skipped")
    if draft_model is not None:
        small = CachedLM(draft_model, role="draft")
        for g in gammas:
            assistant = {"num_assistant_tokens": g, "num_assistant_tokens_schedule": "constant",
                         "assistant_confidence_threshold": 0.0}
            rows.append(hf_row(f"hf_assisted[g={g}]", target_model, eos, {"gamma": g}, assistant,
                               assistant_model=draft_model))
            rows.append(ours_row(f"model[g={g}]", "model", target, build_drafter("model", target, MethodOptions(draft_model=small)),
                                 "exact", MethodOptions(), g, eos, {"gamma": g}))
        for fb in fbs:
            for rb in rbs:
                o = MethodOptions(draft_model=small, alpha_fb=fb, alpha_rb=rb)
                rows.append(ours_row(f"bild[fb={fb:g},rb={rb:g}]", "bild", target, build_drafter("model", target, o),
                                     "bild", o, bild_gamma, eos, {"alpha_fb": fb, "alpha_rb": rb, "max_draft": bild_gamma}))
    else:
        notes.append("no small model: hf_assisted, model and bild rows skipped")
    return rows, notes


def _summary(row: Row, refs: list[str], greedy_ids: list[list[int]], base_seconds: float, eos: int) -> dict:
    import sacrebleu

    n = len(row.texts)
    out = {"name": row.name, "family": row.family, "lossless": row.lossless, "settings": row.settings,
           "bleu": round(sacrebleu.corpus_bleu(row.texts, [refs[:n]]).score, 2),
           "chrf": round(sacrebleu.corpus_chrf(row.texts, [refs[:n]]).score, 2),
           "same_as_greedy": sum(_strip(a, eos) == _strip(b, eos) for a, b in zip(row.ids, greedy_ids)) / max(n, 1),
           "seconds_per_sentence": sum(row.seconds) / max(n, 1)}
    out["speedup_vs_hf_greedy"] = base_seconds / out["seconds_per_sentence"] if out["seconds_per_sentence"] else None
    if row.stats:
        calls = sum(s["target_calls"] for s in row.stats)
        out["tokens_per_call"] = sum(s["new_tokens"] for s in row.stats) / max(calls, 1)
        out["accepted_per_call"] = sum(s["accepted_tokens"] for s in row.stats) / max(calls, 1)
        total = sum(s["time_total"] for s in row.stats) or 1.0
        out["time_split"] = {k.replace("time_", ""): sum(s[k] for s in row.stats) / total for k in TIME_PARTS}
    return out


def run_sweep(target_model, draft_model, nat_path, tokenizer, prompts: list[Prompt], max_new_tokens: int,
              log: Callable[[str], None] = print, **grid) -> dict:
    eos = tokenizer.eos_token_id
    rows, notes = build_rows(target_model, draft_model, nat_path, eos, **grid)
    sources = [tokenizer(p.text, return_tensors="pt").input_ids for p in prompts]
    with torch.inference_mode():
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
    base = sum(rows[0].seconds) / max(len(rows[0].seconds), 1)
    return {"rows": [_summary(r, refs, greedy_ids, base, eos) for r in rows], "notes": notes,
            "sentences": len(prompts), "max_new_tokens": max_new_tokens,
            "examples": [{"source": prompts[0].text, "reference": prompts[0].reference,
                          **{r.name: r.texts[0] for r in rows}}] if prompts else []}


def _table(rows: list[dict], columns: list[tuple[str, str, Callable]]) -> list[str]:
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(c[2](r.get(c[1])) if r.get(c[1]) is not None else "-" for c in columns) + " |")
    return lines


def render_markdown(result: dict) -> str:
    f2 = lambda v: f"{v:.2f}"  # noqa: E731
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    rows = result["rows"]
    main = _table(rows, [("row", "name", lambda v: f"`{v}`"), ("BLEU", "bleu", f2), ("chrF", "chrf", f2),
                         ("same as AT greedy", "same_as_greedy", pct), ("tokens / target call", "tokens_per_call", f2),
                         ("s / sentence", "seconds_per_sentence", lambda v: f"{v:.4f}"),
                         ("speedup vs HF greedy", "speedup_vs_hf_greedy", lambda v: f"{v:.2f}x")])
    split = [r for r in rows if r.get("time_split")]
    parts = ["| row | encoders (prefill) | drafter | verifier forward | verify rule | other |", "|---|---|---|---|---|---|"]
    for r in split:
        t = r["time_split"]
        parts.append(f"| `{r['name']}` | {pct(t['prefill'])} | {pct(t['draft'])} | {pct(t['target'])} | "
                     f"{pct(t['verify'])} | {pct(t['other'])} |")
    lines = [f"# {result['name']}", "", f"Command: `{result['command']}`", "",
             f"{result['sentences']} sentences of {result['prompts']}, at most {result['max_new_tokens']} new tokens, "
             f"{result['threads']} thread(s), {result['machine']}; {result['date']}.", "", *main, "",
             "## Where the time goes (our loop; SpecDec Table 18)", "", *parts, ""]
    if result["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in result["notes"]], ""]
    return "\n".join(lines)


def plot_bild(rows: list[dict], path: Path) -> Path | None:
    """BLEU against seconds per sentence: BiLD rows as a curve, the baselines as points (BiLD Figure 4)."""
    points = [r for r in rows if r["family"] in ("bild", "hf_greedy", "autoregressive", "model", "specdec", "hf_beam")]
    if not any(r["family"] == "bild" for r in points):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for family, marker in (("bild", "o"), ("model", "s"), ("specdec", "^"), ("hf_greedy", "*"), ("autoregressive", "x"),
                           ("hf_beam", "D")):
        sel = [r for r in points if r["family"] == family]
        if sel:
            ax.scatter([r["seconds_per_sentence"] * 1000 for r in sel], [r["bleu"] for r in sel], marker=marker, label=family)
    ax.set_xlabel("ms per sentence")
    ax.set_ylabel("BLEU (test)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(result: dict, out: Path, name: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / f"{name}.json"), "markdown": str(out / f"{name}.md")}
    png = plot_bild(result["rows"], out / f"{name}-bild.png")
    if png is not None:
        files["bild_png"] = str(png)
    result["files"] = files
    Path(files["json"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
    Path(files["markdown"]).write_text(render_markdown(result))
    return files
