"""`draftverify reproduce bita`: the BiTA paper's ablations on our zoo, as counts (no wall clock).

Greedy, HumanEval prompts (the bench's shipped set), through the one decoding loop; for every configuration:
tokens per target call (accepted drafts + the target's own token, the paper's speedup driver), the verify width
(positions one target call scores: pending token + tree + mask tokens) and whether the text equals the target's
own greedy text (it must: every mode is exact). Configurations:

- decoding modes (Table 4): straightforward chain, full tree top-k for k = 1..4, efficient tree top-k;
- prompt designs (Table 3): the adapters with the first adapter's M and P (mask tokens only / shallow / deep);
- number of prompt tokens (Figure 8): the adapters with the first's prompt kind and M, one per P;
- number of mask tokens (Figure 9): the adapters with the first's prompt kind and P, one per trained M;
- mask tokens used at decode time: the first m of the first adapter's M masks (a group's first m masks see only
  each other, so this needs no retraining; the paper's Figure 9 retrains per M, as the mask-count table does).

The adapter tables (efficient tree) label each adapter by its config (prompt kind, P, M) and show the training
steps and held-out top-1 accuracy per mask token its trainer saved in bita.json, so one sees the adapters were
compared at an equal budget. An adapter in several tables is decoded once.

With a cost curve (`draftverify bench speed --cost-curve ... --cost-sizes ...` JSON), each row also gets an estimated
speedup over one-token decoding: tokens per call / (cost of scoring the verify width / cost of scoring 1 token),
interpolated between measured widths (none outside them).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters.base import NoDrafter
from ..drafters.bita import BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter
from ..drafters.bita_adapter import FOLDER, BitaAdapter
from ..loop import generate
from ..markdown import command_block, markdown_table
from ..methods import MethodOptions, build_verifier
from ..types import SamplingParams

FULL_KS = (1, 2, 3, 4)
EFFICIENT_KS = (2, 3, 4, 5)
TABLES = ("modes", "prompts", "prompt-count", "mask-count", "masks")
ADAPTER_TABLES = ("prompts", "prompt-count", "mask-count")  # one row per chosen adapter


def variant_label(adapter: BitaAdapter) -> str:
    c = adapter.config
    return {
        "none": "mask tokens only",
        "shallow": f"shallow prompt (P={c.num_prompts})",
        "deep": f"deep prompt (P={c.num_prompts})",
    }[c.prompt] + f", M={c.num_masks}"


def training_facts(folder: str | Path) -> dict:
    """The training report `draftverify train bita` saved next to the adapter ({} for an adapter saved without)."""
    info = json.loads((Path(folder) / f"{FOLDER.stem}.json").read_text())
    return info.get("training") or {}


def adapter_rows(adapters: dict[str, BitaAdapter], main: str) -> dict[str, list[str]]:
    """Which adapters each adapter table compares, against the first (main) one: the prompt designs at its M and P,
    the prompt counts at its kind and M (sorted by P), the mask counts at its kind and P (sorted by M)."""
    ref = adapters[main].config
    configs = {name: a.config for name, a in adapters.items()}
    designs = [n for n, c in configs.items() if c.num_masks == ref.num_masks and c.num_prompts in (0, ref.num_prompts)]
    counts_p = [n for n, c in configs.items() if c.prompt == ref.prompt and c.num_masks == ref.num_masks]
    counts_m = [n for n, c in configs.items() if c.prompt == ref.prompt and c.num_prompts == ref.num_prompts]
    return {
        "prompts": designs,
        "prompt-count": sorted(counts_p, key=lambda n: configs[n].num_prompts),
        "mask-count": sorted(counts_m, key=lambda n: configs[n].num_masks),
    }


def configurations(
    adapters: dict[str, BitaAdapter], main: str, topk: int, tables: tuple[str, ...] = TABLES
) -> list[tuple[str, str, tuple, object]]:
    """(table, row label, measurement key, drafter factory) for every row of the chosen tables; rows with one key
    are one measurement (an adapter shown in several tables)."""
    primary = adapters[main]
    rows = [("modes", "straightforward (chain)", ("chain", main), lambda: BitaDrafter(primary))]
    rows += [
        ("modes", f"full tree k={k}", ("full", main, k), lambda k=k: BitaFullTreeDrafter(primary, k)) for k in FULL_KS
    ]
    rows += [
        ("modes", f"efficient tree k={k}", ("efficient", main, k, None), lambda k=k: BitaEfficientDrafter(primary, k))
        for k in EFFICIENT_KS
    ]
    for table, names in adapter_rows(adapters, main).items():
        rows += [
            (
                table,
                variant_label(adapters[n]),
                ("efficient", n, topk, None),
                lambda a=adapters[n]: BitaEfficientDrafter(a, topk),
            )
            for n in names
        ]
    m_all = primary.config.num_masks
    rows += [
        (
            "masks",
            f"m={m} of M={m_all}",
            ("efficient", main, topk, None if m == m_all else m),
            lambda m=m: BitaEfficientDrafter(primary, topk, m),
        )
        for m in range(1, m_all + 1)
    ]
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


def measure(
    target, make, prompts: list[torch.Tensor], references: list[list[int]], new_tokens: int, verifier, eos: int | None
) -> dict:
    """Counts of one drafter configuration over the prompts: target calls, new tokens, verify positions, equality."""
    calls = tokens = positions = equal = 0
    for ids, ref in zip(prompts, references):
        drafter = make()
        widths = []  # each verify pass's positions: the pending token, the draft and the mask tokens
        original = drafter.wrap_target

        def counting(target, original=original, widths=widths):
            wrapped = original(target)
            forward = wrapped.forward

            def counted(*args, **kwargs):
                out = forward(*args, **kwargs)
                widths.append(out.logits.shape[1])
                return out

            wrapped.forward = counted
            return wrapped

        drafter.wrap_target = counting
        out = generate(target, drafter, verifier, ids, max_new_tokens=new_tokens, eos_token_id=eos)
        calls += out.stats.target_calls
        tokens += out.stats.new_tokens
        positions += sum(widths)
        equal += out.new_tokens[0].tolist() == ref
    return {
        "tokens_per_call": tokens / calls,
        "mean_verify_width": positions / calls,
        "equal_to_greedy": equal / len(prompts),
        "target_calls": calls,
        "new_tokens": tokens,
    }


def run_report(
    target,
    adapters: dict[str, BitaAdapter],
    main: str,
    prompts: list[torch.Tensor],
    new_tokens: int,
    topk: int,
    eos: int | None,
    cost: dict | None = None,
    log=print,
    tables: tuple[str, ...] = TABLES,
    facts: dict[str, dict] | None = None,
) -> dict:
    """facts: each adapter's training report (training_facts), shown in the adapter tables."""
    facts = facts or {}
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    references = [
        generate(target, NoDrafter(), verifier, ids, max_new_tokens=new_tokens, eos_token_id=eos).new_tokens[0].tolist()
        for ids in prompts
    ]
    measured: dict[tuple, dict] = {}
    rows = []
    for table, label, key, make in configurations(adapters, main, topk, tables):
        if key not in measured:
            measured[key] = measure(target, make, prompts, references, new_tokens, verifier, eos)
        counts = measured[key]
        rel = relative_cost(cost, counts["mean_verify_width"])
        row = {
            "table": table,
            "config": label,
            **counts,
            "estimated_speedup": None if rel is None else counts["tokens_per_call"] / rel,
        }
        if table in ADAPTER_TABLES:
            c, trained = adapters[key[1]].config, facts.get(key[1], {})
            row.update(
                adapter=key[1],
                prompt=c.prompt,
                num_prompts=c.num_prompts,
                num_masks=c.num_masks,
                steps=trained.get("steps"),
                heldout_accuracy=(trained.get("heldout_accuracy") or {}).get("after"),
            )
        rows.append(row)
        log(
            f"{table:12s} {label:32s} tokens/call {counts['tokens_per_call']:.3f}  "
            f"width {counts['mean_verify_width']:.1f}  equal {counts['equal_to_greedy']:.0%}"
        )
    return {
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "topk": topk,
        "main_adapter": main,
        "adapters": {
            name: {
                "prompt": a.config.prompt,
                "num_prompts": a.config.num_prompts,
                "num_masks": a.config.num_masks,
                "steps": facts.get(name, {}).get("steps"),
                "command": facts.get(name, {}).get("command"),
            }
            for name, a in adapters.items()
        },
        "rows": rows,
    }


def _accuracy(row: dict) -> str:
    acc = row.get("heldout_accuracy")
    return "-" if not acc else " / ".join(f"{a:.3f}" for a in acc)


def markdown(result: dict, command: str) -> str:
    k = result["topk"]
    titles = {
        "modes": "Decoding modes (the paper's Table 4)",
        "prompts": f"Prompt designs (Table 3), efficient tree k={k}",
        "prompt-count": f"Number of prompt tokens (Figure 8), one adapter per P, efficient tree k={k}",
        "mask-count": f"Number of mask tokens (Figure 9), one adapter per M, efficient tree k={k}",
        "masks": f"Mask tokens used at decode time (the first m of one adapter's M), efficient tree k={k}",
    }
    lines = [
        f"# BiTA ablations on the code zoo (counts; greedy, {result['prompts']} HumanEval prompts, "
        f"{result['new_tokens']} new tokens each)",
        "",
        *command_block("Reproduce:", command),
        "",
        "tokens/call = new tokens / target calls; width = positions one target call scores (pending token + "
        "candidate tree + mask tokens); equal = share of prompts whose text equals the target's greedy text; "
        "est. speedup = tokens/call over the measured cost of scoring `width` tokens relative to 1 (only with "
        "--cost and inside its measured widths).",
        "",
    ]
    if any(r["table"] in ADAPTER_TABLES for r in result["rows"]):
        lines += [
            "Adapter tables: steps = the adapter's training steps; held-out top-1 = its trainer's held-out "
            "accuracy of mask 1..M on the token 2..M+1 after the last real one (from its bita.json).",
            "",
        ]
    for table, title in titles.items():
        chosen = [r for r in result["rows"] if r["table"] == table]
        if not chosen:
            continue
        adapter = table in ADAPTER_TABLES
        cells = [
            (r["config"], *(("-" if r["steps"] is None else r["steps"], _accuracy(r)) if adapter else ()))
            + (f"{r['tokens_per_call']:.3f}", f"{r['mean_verify_width']:.1f}", f"{100 * r['equal_to_greedy']:.0f}%")
            + ("-" if r["estimated_speedup"] is None else f"{r['estimated_speedup']:.2f}x",)
            for r in chosen
        ]
        trained_columns = ("steps", "held-out top-1 per mask") if adapter else ()
        columns = ("configuration", *trained_columns, "tokens/call", "width", "equal", "est. speedup")
        lines += [f"## {title}", "", *markdown_table(columns, cells), ""]
    if result.get("plot"):
        lines += [f"![tokens per call vs P and vs M]({result['plot']})", ""]
    trained = {name: a["command"] for name, a in result["adapters"].items() if a.get("command")}
    if trained:
        lines += ["## The adapters' training commands (from their bita.json)", ""]
        for name, cmd in trained.items():
            lines += [f"- `{name}`: `{cmd}`"]
        lines.append("")
    return "\n".join(lines)


def main(
    target_dir: str,
    adapter_dirs: list[str],
    num_prompts: int,
    new_tokens: int,
    topk: int,
    out: str,
    command: str,
    cost_path: str | None = None,
    log=print,
    tables: tuple[str, ...] = TABLES,
) -> dict:
    from transformers import AutoTokenizer

    from ..api import load_model
    from ..bench.prompts import load_prompts

    target = load_model(target_dir, "float32")
    adapters = {str(d): BitaAdapter.load(d) for d in adapter_dirs}
    facts = {str(d): training_facts(d) for d in adapter_dirs}
    tok = AutoTokenizer.from_pretrained(target_dir)
    prompts = [tok(p.text, return_tensors="pt").input_ids for p in load_prompts("humaneval")[:num_prompts]]
    cost = json.loads(Path(cost_path).read_text()) if cost_path else None
    result = run_report(
        target, adapters, str(adapter_dirs[0]), prompts, new_tokens, topk, tok.eos_token_id, cost, log, tables, facts
    )
    result["command"] = command
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if any(sum(r["table"] == t for r in result["rows"]) > 1 for t in ("prompt-count", "mask-count")):
        from ..bench.plots import plot_bita_counts

        result["plot"] = plot_bita_counts(result["rows"], Path(out + ".png"), "BiTA on the code zoo").name
    Path(out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(out + ".md").write_text(markdown(result, command))
    return result
