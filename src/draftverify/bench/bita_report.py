"""`draftverify bita-report`: the BiTA paper's ablations on our zoo, as counts (no wall clock).

Greedy, HumanEval prompts (the bench's shipped set), through the one decoding loop; for every configuration:
tokens per target call (accepted drafts + the target's own token, the paper's speedup driver), the verify width
(positions one target call scores: pending token + tree + mask tokens) and whether the text equals the target's
own greedy text (it must: every mode is exact). Configurations:

- decoding modes (Table 4): straightforward chain, full tree top-k for k = 1..4, efficient tree top-k;
- prompt designs (Table 3): one row per adapter given (mask tokens only / shallow / deep prompt), efficient tree;
- number of mask tokens (Figure 9): the first m of the adapter's M masks (a group's first m masks see only each
  other, so this needs no retraining; the paper retrains per m).

With a cost curve (`draftverify bench --cost-curve ... --cost-sizes ...` JSON), each row also gets an estimated
speedup over one-token decoding: tokens per call / (cost of scoring the verify width / cost of scoring 1 token),
interpolated between measured widths (none outside them).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters.base import NoDrafter
from ..drafters.bita import BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter
from ..drafters.bita_adapter import BitaAdapter
from ..loop import generate
from ..methods import MethodOptions, build_verifier
from ..types import SamplingParams

FULL_KS = (1, 2, 3, 4)
EFFICIENT_KS = (2, 3, 4, 5)
TABLES = ("modes", "prompts", "masks")


def variant_label(adapter: BitaAdapter) -> str:
    c = adapter.config
    return {"none": "mask tokens only", "shallow": f"shallow prompt (P={c.num_prompts})",
            "deep": f"deep prompt (P={c.num_prompts})"}[c.prompt] + f", M={c.num_masks}"


def configurations(adapters: dict[str, BitaAdapter], main: str, topk: int,
                   tables: tuple[str, ...] = TABLES) -> list[tuple[str, str, object]]:
    """(table, row label, drafter factory) for every row of the report's chosen tables."""
    primary = adapters[main]
    rows = [("modes", "straightforward (chain)", lambda: BitaDrafter(primary))]
    rows += [("modes", f"full tree k={k}", lambda k=k: BitaFullTreeDrafter(primary, k)) for k in FULL_KS]
    rows += [("modes", f"efficient tree k={k}", lambda k=k: BitaEfficientDrafter(primary, k)) for k in EFFICIENT_KS]
    rows += [("prompts", variant_label(a), lambda a=a: BitaEfficientDrafter(a, topk)) for a in adapters.values()]
    rows += [("masks", f"m={m} of M={primary.config.num_masks}", lambda m=m: BitaEfficientDrafter(primary, topk, m))
             for m in range(1, primary.config.num_masks + 1)]
    return [row for row in rows if row[0] in tables]


def relative_cost(cost: dict | None, width: float) -> float | None:
    """Cost of scoring `width` tokens over scoring 1, from a cost curve's eager-float32 medians (interpolated)."""
    if cost is None:
        return None
    points = sorted((p["n"], p["median_ms"]) for p in cost["modes"]["eager-float32"]["points"])
    base = dict(points).get(1)
    if base is None or not points[0][0] <= width <= points[-1][0]:
        return None
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n0 <= width <= n1:
            return (t0 + (t1 - t0) * (width - n0) / max(n1 - n0, 1)) / base
    return points[0][1] / base


def run_report(target, adapters: dict[str, BitaAdapter], main: str, prompts: list[torch.Tensor], new_tokens: int,
               topk: int, eos: int | None, cost: dict | None = None, log=print, tables: tuple[str, ...] = TABLES) -> dict:
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    references = [generate(target, NoDrafter(), verifier, ids, max_new_tokens=new_tokens, eos_token_id=eos)
                  .new_tokens[0].tolist() for ids in prompts]
    rows = []
    for table, label, make in configurations(adapters, main, topk, tables):
        calls = tokens = positions = equal = 0
        for ids, ref in zip(prompts, references):
            drafter = make()
            widths = []
            original = drafter.verify_inputs

            def counted(draft, original=original, widths=widths):
                extras = original(draft)
                widths.append(1 + draft.length + extras.count)
                return extras

            drafter.verify_inputs = counted
            out = generate(target, drafter, verifier, ids, max_new_tokens=new_tokens, eos_token_id=eos)
            calls += out.stats.target_calls
            tokens += out.stats.new_tokens
            positions += sum(widths)
            equal += out.new_tokens[0].tolist() == ref
        width = positions / calls
        per_call = tokens / calls
        rel = relative_cost(cost, width)
        rows.append({"table": table, "config": label, "tokens_per_call": per_call, "mean_verify_width": width,
                     "equal_to_greedy": equal / len(prompts), "target_calls": calls, "new_tokens": tokens,
                     "estimated_speedup": None if rel is None else per_call / rel})
        log(f"{table:8s} {label:32s} tokens/call {per_call:.3f}  width {width:.1f}  equal {equal}/{len(prompts)}")
    return {"prompts": len(prompts), "new_tokens": new_tokens, "topk": topk, "main_adapter": main,
            "adapters": {name: {"prompt": a.config.prompt, "num_prompts": a.config.num_prompts,
                                "num_masks": a.config.num_masks} for name, a in adapters.items()},
            "rows": rows}


def markdown(result: dict, command: str) -> str:
    titles = {"modes": "Decoding modes (the paper's Table 4)", "prompts": "Prompt designs (Table 3), efficient tree "
              f"k={result['topk']}", "masks": f"Number of mask tokens (Figure 9), efficient tree k={result['topk']}"}
    lines = [f"# BiTA ablations on the code zoo (counts; greedy, {result['prompts']} HumanEval prompts, "
             f"{result['new_tokens']} new tokens each)", "", "Reproduce:", "", "```bash", command, "```", "",
             "tokens/call = new tokens / target calls; width = positions one target call scores (pending token + "
             "candidate tree + mask tokens); equal = share of prompts whose text equals the target's greedy text; "
             "est. speedup = tokens/call over the measured cost of scoring `width` tokens relative to 1 (only with "
             "--cost and inside its measured widths).", ""]
    for table, title in titles.items():
        if not any(r["table"] == table for r in result["rows"]):
            continue
        lines += [f"## {title}", "", "| configuration | tokens/call | width | equal | est. speedup |", "|---|---|---|---|---|"]
        for r in result["rows"]:
            if r["table"] == table:
                est = "-" if r["estimated_speedup"] is None else f"{r['estimated_speedup']:.2f}x"
                lines.append(f"| {r['config']} | {r['tokens_per_call']:.3f} | {r['mean_verify_width']:.1f} | "
                             f"{100 * r['equal_to_greedy']:.0f}% | {est} |")
        lines.append("")
    return "\n".join(lines)


def main(target_dir: str, adapter_dirs: list[str], num_prompts: int, new_tokens: int, topk: int, out: str,
         command: str, cost_path: str | None = None, log=print, tables: tuple[str, ...] = TABLES) -> dict:
    from transformers import AutoTokenizer

    from ..api import load_model
    from .prompts import load_prompts

    target = load_model(target_dir, "float32")
    adapters = {str(d): BitaAdapter.load(d) for d in adapter_dirs}
    tok = AutoTokenizer.from_pretrained(target_dir)
    prompts = [tok(p.text, return_tensors="pt").input_ids for p in load_prompts("humaneval")[:num_prompts]]
    cost = json.loads(Path(cost_path).read_text()) if cost_path else None
    result = run_report(target, adapters, str(adapter_dirs[0]), prompts, new_tokens, topk, tok.eos_token_id, cost, log, tables)
    result["command"] = command
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(out + ".md").write_text(markdown(result, command))
    return result
