"""reproduce bita's pieces on a tiny model: every table's rows, exactness, widths, the cost interpolation."""

from __future__ import annotations

import torch

from conftest import varied_model
from draftverify.drafters import BitaAdapter
from draftverify.reproduce import bita as br

torch.set_num_threads(1)


def test_report_runs_every_table_exactly_and_counts_widths():
    model = varied_model("llama")
    torch.manual_seed(0)
    adapters = {"deep": BitaAdapter.for_target(model, 3, "deep", 4), "none": BitaAdapter.for_target(model, 3, "none")}
    prompts = [torch.tensor([[5, 17, 33, 8, 41]]), torch.tensor([[9, 2, 60, 7]])]
    cost = {"modes": {"eager-float32": {"points": [{"n": 1, "median_ms": 10.0}, {"n": 64, "median_ms": 40.0}]}}}
    result = br.run_report(
        model, adapters, "deep", prompts, new_tokens=10, topk=2, eos=None, cost=cost, log=lambda m: None
    )
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
    text = br.markdown(result, "draftverify reproduce bita --test")
    assert "| full tree k=4 |" in text and "Mask tokens used at decode time" in text


def test_adapter_tables_compare_trained_counts_against_the_first_adapter(monkeypatch, tmp_path):
    model = varied_model("llama")
    torch.manual_seed(0)
    specs = {
        "d4": (3, "deep", 4),
        "d8": (3, "deep", 8),
        "d2": (3, "deep", 2),
        "m2": (2, "deep", 4),
        "s4": (3, "shallow", 4),
        "none": (3, "none", 0),
        "s2m2": (2, "shallow", 2),
    }
    adapters = {n: BitaAdapter.for_target(model, m, kind, p) for n, (m, kind, p) in specs.items()}
    assert br.adapter_rows(adapters, "d4") == {
        "prompts": ["d4", "s4", "none"],
        "prompt-count": ["d2", "d4", "d8"],
        "mask-count": ["m2", "d4"],
    }  # s2m2 matches the reference in nothing

    calls = []
    measure = br.measure
    monkeypatch.setattr(br, "measure", lambda *a, **k: calls.append(1) or measure(*a, **k))
    facts = {
        "d4": {
            "steps": 60,
            "heldout_accuracy": {"before": [0.1, 0.1, 0.1], "after": [0.5, 0.25, 0.125]},
            "command": "draftverify train bita --num-prompts 4",
        }
    }
    prompts = [torch.tensor([[5, 17, 33, 8, 41]])]
    tables = ("prompts", "prompt-count", "mask-count", "masks")
    result = br.run_report(
        model, adapters, "d4", prompts, new_tokens=8, topk=2, eos=None, log=lambda m: None, tables=tables, facts=facts
    )
    rows = result["rows"]
    assert [(r["table"], r["config"]) for r in rows if r["table"] == "prompt-count"] == [
        ("prompt-count", f"deep prompt (P={p}), M=3") for p in (2, 4, 8)
    ]
    assert [r["num_masks"] for r in rows if r["table"] == "mask-count"] == [2, 3]
    assert all(r["equal_to_greedy"] == 1.0 for r in rows)
    # d4 is in three adapter tables and is masks' m=3: one measurement; + s4, none, d2, d8, m2, m=1, m=2 of d4
    assert len(calls) == 8
    main_rows = [r for r in rows if r["table"] in br.ADAPTER_TABLES and r["adapter"] == "d4"]
    assert len(main_rows) == 3 and all(
        r["steps"] == 60 and r["heldout_accuracy"] == [0.5, 0.25, 0.125] for r in main_rows
    )
    assert next(r for r in rows if r["config"] == "m=3 of M=3")["target_calls"] == main_rows[0]["target_calls"]
    assert all(
        r["steps"] is None and r["heldout_accuracy"] is None
        for r in rows
        if r["table"] in br.ADAPTER_TABLES and r["adapter"] != "d4"
    )
    text = br.markdown(result, "draftverify reproduce bita --test")
    assert "| deep prompt (P=4), M=3 | 60 | 0.500 / 0.250 / 0.125 |" in text
    assert "| deep prompt (P=8), M=3 | - | - |" in text and "one adapter per P" in text and "one adapter per M" in text
    assert "- `d4`: `draftverify train bita --num-prompts 4`" in text and "`d8`:" not in text  # d8 has no facts

    from draftverify.bench.plots import plot_bita_counts

    png = plot_bita_counts(rows, tmp_path / "counts.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_facts_come_from_the_adapters_json(tmp_path):
    model = varied_model("llama")
    adapter = BitaAdapter.for_target(model, 2, "deep", 3)
    adapter.save(tmp_path / "trained", metadata={"training": {"steps": 7}})
    adapter.save(tmp_path / "bare")
    assert br.training_facts(tmp_path / "trained") == {"steps": 7}
    assert br.training_facts(tmp_path / "bare") == {}
