"""reproduce blockwise's pieces on a tiny model: repetition statistics, the oracle drafter, the tables."""

from __future__ import annotations

import numpy as np
import torch

from conftest import VOCAB, build_model, varied_model
from draftverify.drafters import BlockwiseHeads
from draftverify.drafters.ngram import NgramTable
from draftverify.reproduce import blockwise as br

torch.set_num_threads(1)


def test_repetition_counts_identical_neighbours_and_the_longest_run():
    rep = br.repetition([[1, 1, 1, 2], [3, 4, 3]])
    assert rep["consecutive_pct"] == 100 * 2 / 5
    assert rep["mean_max_run"] == (3 + 1) / 2 and rep["drafts"] == 2


def test_accepted_is_the_prefix_the_target_would_keep():
    truth = [1, 2, 3, 4, 5]
    assert br.accepted([3, 4, 9], truth, 2) == 2
    assert br.accepted([9], truth, 2) == 0
    assert br.accepted([4, 5], truth, 3) == 2 and br.accepted([5, 6], truth, 4) == 1  # truth ends after 5


def test_report_runs_every_variant_and_the_top1_oracle_is_plain_bpd(tmp_path):
    model = varied_model("llama")
    heads = BlockwiseHeads.for_target(model, 4)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * p.shape[-1] ** -0.5)
    table = NgramTable.from_sequences([np.random.default_rng(0).integers(4, VOCAB, 300).tolist()], 3, VOCAB)
    prompts = [torch.tensor([[5, 17, 33, 8, 41]]), torch.tensor([[9, 2, 60, 7]]), torch.tensor([[11, 12, 13]])]
    rescorer = build_model("llama", seed=7)
    result = br.run_report(model, heads, table, rescorer, prompts, new_tokens=12, tune=1, k=3, log=lambda m: None)
    be = result["block_efficiency"]
    assert be["oracle k=1"] == be["bpd"]
    assert be["oracle k=16"] >= 1.0 and set(be) >= {"ngram3 a=0.5", "ngram2 a=0.5", "pbest p=4 0-gram"}
    assert result["tuned_alpha"] in br.ALPHAS and len(result["head_entropy_nats"]) == 4
    assert result["repetition"]["bpd"]["drafts"] > 0
    assert {f"neural a={a}" for a in br.NEURAL_ALPHAS} <= set(be) and result["tuned_neural_alpha"] in br.NEURAL_ALPHAS
    duel = result["neural_vs_plain"]
    assert duel["win"] + duel["tie"] + duel["loss"] > 0
    assert duel["repair"] <= duel["win"] and duel["regress"] <= duel["loss"]
    bins = result["kept_by_head2_entropy"]
    assert sum(b["steps"] for b in bins) > 0 and all(b["low"] <= b["high"] for b in bins)
    assert [b["low"] for b in bins] == sorted(b["low"] for b in bins)
    text = br.markdown(result, "draftverify reproduce blockwise --test")
    assert "| bpd | " in text and "h_max" in text and "Table 5" in text
    png = br.plot_report(result, tmp_path / "bpd.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_entropy_bins_sort_steps_by_entropy_and_average_what_was_kept():
    bins = br.entropy_bins([3.0, 1.0, 2.0, 4.0], [0, 3, 2, 1], bins=2)
    assert bins == [
        {"low": 1.0, "high": 2.0, "steps": 2, "mean_kept": 2.5},
        {"low": 3.0, "high": 4.0, "steps": 2, "mean_kept": 0.5},
    ]


def test_neural_duel_with_alpha_zero_ties_every_step():
    """alpha = 0 leaves the heads' argmax, so the rescored draft is the plain one at every step."""
    model = varied_model("qwen2")
    z = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    truth = [5, 6, 7, 8, 9, 10]
    plain = z.argmax(-1).tolist()
    tally = br.neural_duel([(2, z), (3, z)], [plain, plain], truth, model, k=4, alpha=0.0)
    assert tally["tie"] == 2 and tally["win"] == tally["loss"] == 0
