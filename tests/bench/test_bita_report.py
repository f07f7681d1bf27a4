"""bita-report's pieces on a tiny model: every table's rows, exactness, widths, the cost interpolation."""
from __future__ import annotations

import torch
from conftest import varied_model

from draftverify.bench import bita_report as br
from draftverify.drafters import BitaAdapter

torch.set_num_threads(1)


def test_report_runs_every_table_exactly_and_counts_widths():
    model = varied_model("llama")
    torch.manual_seed(0)
    adapters = {"deep": BitaAdapter.for_target(model, 3, "deep", 4), "none": BitaAdapter.for_target(model, 3, "none")}
    prompts = [torch.tensor([[5, 17, 33, 8, 41]]), torch.tensor([[9, 2, 60, 7]])]
    cost = {"modes": {"eager-float32": {"points": [{"n": 1, "median_ms": 10.0}, {"n": 64, "median_ms": 40.0}]}}}
    result = br.run_report(model, adapters, "deep", prompts, new_tokens=10, topk=2, eos=None, cost=cost, log=lambda m: None)
    rows = {(r["table"], r["config"]): r for r in result["rows"]}
    assert all(r["equal_to_greedy"] == 1.0 for r in result["rows"])  # every mode is exact
    assert len([t for t, _ in rows if t == "modes"]) == 1 + len(br.FULL_KS) + len(br.EFFICIENT_KS)
    assert ("prompts", "mask tokens only, M=3") in rows and ("prompts", "deep prompt (P=4), M=3") in rows
    assert [c for t, c in rows if t == "masks"] == ["m=1 of M=3", "m=2 of M=3", "m=3 of M=3"]
    # the full tree k=2 scores pending + 14 nodes + 15 groups of 3 masks once it drafts (the first pass: 1 + 3)
    full = rows[("modes", "full tree k=2")]
    assert 1 + 3 < full["mean_verify_width"] <= 1 + 14 + 15 * 3
    assert br.relative_cost(cost, 1) == 1.0 and br.relative_cost(cost, 64) == 4.0 and br.relative_cost(cost, 65) is None
    assert full["estimated_speedup"] == full["tokens_per_call"] / br.relative_cost(cost, full["mean_verify_width"])
    text = br.markdown(result, "draftverify bita-report --test")
    assert "| full tree k=4 |" in text and "Number of mask tokens" in text
