"""The bench report's head-to-head section (bench/report.py): our fastest exact row per backend against each
peer family's fastest row, printed by the bench rather than worked out by hand."""

from __future__ import annotations

from draftverify.bench.report import head_to_head


def row(runner, family, kind, tps, equal=1.0, lossless=True, temperature=0.0):
    return {
        "runner": runner,
        "family": family,
        "kind": kind,
        "tokens_per_second": tps,
        "equal_to_baseline": equal,
        "lossless": lossless,
        "temperature": temperature,
    }


def test_each_backend_best_and_best_model_row_meet_each_peer_family_best():
    rows = [
        row("hf_generate", "hf_generate", "hf", 50.0),
        row("ours_autoregressive", "ours_autoregressive", "ours", 49.0),
        row("hf_assisted[g=4]", "hf_assisted", "hf", 100.0),
        row("hf_assisted[hf-default]", "hf_assisted", "hf", 120.0),
        row("llamacpp_prompt_lookup[g=4]", "llamacpp_prompt_lookup", "llamacpp", 200.0, lossless=False),
        row("llamacpp_prompt_lookup[default]", "llamacpp_prompt_lookup", "llamacpp", 180.0, lossless=False),
        row("model[conf]", "model", "ours", 150.0),
        row("lookup_model[conf]", "lookup_model", "ours", 160.0),
        row("prompt_lookup[g=4]", "prompt_lookup", "ours", 999.0, equal=0.875),  # not exact: never a pick
        row("bild[0.5,2]", "bild", "ours", 500.0, lossless=False),  # lossy: never a pick
        row("llamacpp:model[conf]", "model", "ours", 300.0),
    ]
    table = head_to_head(rows)
    pairs = [(r[1], r[3], r[5]) for r in table]
    assert pairs == [
        ("`lookup_model[conf]`", "`hf_assisted[hf-default]`", "1.33x"),
        ("`lookup_model[conf]`", "`llamacpp_prompt_lookup[g=4]`", "0.80x"),
        ("`model[conf]`", "`hf_assisted[hf-default]`", "1.25x"),
        ("`model[conf]`", "`llamacpp_prompt_lookup[g=4]`", "0.75x"),
        ("`llamacpp:model[conf]`", "`hf_assisted[hf-default]`", "2.50x"),
        ("`llamacpp:model[conf]`", "`llamacpp_prompt_lookup[g=4]`", "1.50x"),
    ]
    assert {r[0] for r in table} == {"0 (greedy)"}
    assert head_to_head([row("hf_generate", "hf_generate", "hf", 50.0)]) == []
