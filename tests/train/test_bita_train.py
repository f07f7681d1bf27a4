"""`draftverify train bita` on a tiny setup: a tiny LM trained for a few seconds on the tiny corpus is the frozen
target; its mask tokens learn its greedy continuations (batched), resume from their checkpoint and drive bita."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_corpus import write_tiny_corpus

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import bita as tb, lm  # noqa: E402

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=256,
)


def _quiet(msg):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from draftverify.train.tokenizer import build_tokenizer_from_corpus

    tmp = tmp_path_factory.mktemp("bita")
    root = write_tiny_corpus(tmp / "lib")
    build_tokenizer_from_corpus(tmp / "tok", tmp / "manifest.json", vocab_size=300, root=root, val_fraction=0.3)
    lm.train(
        lm.TrainOptions(
            tokenizer=str(tmp / "tok"),
            manifest=str(tmp / "manifest.json"),
            out_dir=str(tmp / "target-run"),
            export_dir=str(tmp / "target"),
            cache_dir=str(tmp / "cache"),
            preset="tiny",
            seq_len=32,
            batch_size=8,
            lr=1e-2,
            warmup_steps=5,
            max_steps=100,
            threads=1,
            bf16=False,
            val_windows=4,
            log_every=1000,
            eval_every_steps=10**6,
            checkpoint_minutes=1000,
            progress=False,
            config_overrides=dict(TINY),
        ),
        log=_quiet,
    )
    return tmp


def _opts(assets, tmp_path, **kw) -> tb.BitaOptions:
    base = dict(
        target=str(assets / "target"),
        manifest=str(assets / "manifest.json"),
        out_dir=str(tmp_path / "bita"),
        work_dir=str(tmp_path / "work"),
        num_masks=3,
        num_prompts=4,
        num_train=16,
        eval_prompts=6,
        min_prompt_tokens=8,
        max_prompt_tokens=16,
        new_tokens=24,
        gen_batch=5,
        cuts=8,
        max_steps=60,
        batch_size=8,
        lr=3e-2,
        warmup_steps=5,
        threads=1,
        log_every=1000,
        progress=False,
        command="draftverify train bita --test",
    )
    base.update(kw)
    return tb.BitaOptions(**base)


def test_sar_batch_labels_are_the_tokens_two_to_m_plus_one_after_the_cut():
    records = [{"prompt": [1, 2, 3], "continuation": [10, 11, 12, 13, 14, 15]}]
    ids, cut, labels = tb.sar_batch(records, 2, 5, np.random.default_rng(0), pad=0)
    seq = [1, 2, 3, 10, 11, 12, 13, 14, 15]
    assert ids.tolist() == [seq]
    assert ((cut >= 2) & (cut <= len(seq) - 4)).all()  # the last prompt token .. the last cut with 2 labels after
    for k, row in zip(cut[0].tolist(), labels[0].tolist()):
        assert row == [seq[k + 2], seq[k + 3]]


def test_batched_generation_equals_the_target_greedy(assets):
    from conftest import reference_greedy
    from draftverify.api import load_model

    target = load_model(assets / "target", "float32")
    prompts = [[5, 6, 7, 8, 9], [20, 21, 22], [7, 8, 9, 10, 11, 12, 13]]
    rows = []
    tb.batched_greedy(target, prompts, 10, eos=None, batch=3, pad=0, on_batch=rows.extend)
    assert rows == [reference_greedy(target, torch.tensor([p]), 10) for p in prompts]


def test_train_bita_learns_resumes_and_drives_the_decoder(assets, tmp_path):
    from conftest import reference_greedy
    from draftverify import SamplingParams, generate
    from draftverify.api import load_model
    from draftverify.drafters import BitaAdapter, BitaEfficientDrafter
    from draftverify.methods import MethodOptions, build_verifier

    logs: list[str] = []
    first = tb.train_bita(_opts(assets, tmp_path, max_steps=20), log=logs.append)
    info = tb.train_bita(_opts(assets, tmp_path, max_steps=60), log=logs.append)
    assert any("resumed from" in m and "step 20" in m for m in logs)
    assert info["steps"] == 60 and first["steps"] == 20
    before, after = info["heldout_accuracy"]["before"], info["heldout_accuracy"]["after"]
    assert len(after) == 3 and sum(after) > sum(before) + 0.3  # the masks learned the target's text ahead
    assert 0 < info["parameter_share"] < 0.2 and info["parameters"] == 3 * 32 + 2 * 2 * 2 * 4 * 16
    card = (tmp_path / "bita" / "README.md").read_text()
    assert "draftverify train bita --test" in card and f"{after[0]:.3f}" in card
    saved = json.loads((tmp_path / "bita" / "bita.json").read_text())
    assert saved["prompt"] == "deep" and saved["training"]["steps"] == 60
    assert tb.write_card(tmp_path / "bita").read_text() == card  # the card is a function of the saved report

    target = load_model(assets / "target", "float32")
    prompt = torch.tensor([[int(t) for t in np.arange(5, 15)]])
    exact = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(
        target, BitaEfficientDrafter(BitaAdapter.load(tmp_path / "bita"), 2), exact, prompt, max_new_tokens=30
    )
    assert out.new_tokens[0].tolist() == reference_greedy(target, prompt, 30)
    assert out.stats.tokens_per_call > 1.2


def test_adapters_trained_with_one_work_dir_share_its_generations(assets, tmp_path, monkeypatch):
    logs: list[str] = []
    tb.train_bita(_opts(assets, tmp_path, max_steps=1, out_dir=str(tmp_path / "deep")), log=logs.append)
    assert not any("cached in" in m for m in logs)  # the first run generates

    def no_generation(*args, **kwargs):
        raise AssertionError("generated again")

    monkeypatch.setattr(tb, "batched_greedy", no_generation)
    logs.clear()
    info = tb.train_bita(
        _opts(assets, tmp_path, max_steps=1, prompt="none", num_masks=2, out_dir=str(tmp_path / "none")),
        log=logs.append,
    )
    assert any("all 16 continuations cached in" in m for m in logs) and any("all 6 continuations" in m for m in logs)
    assert len(info["heldout_accuracy"]["after"]) == 2 and not any("resumed from" in m for m in logs)
    assert sorted(p.parent.name for p in (tmp_path / "work").glob("run-*/checkpoint-*")) == [
        "run-deep-m3-p4",
        "run-none-m2-p4",
    ]  # one run per adapter, one data set


def test_a_rerun_with_other_optimizer_settings_starts_over_and_says_why(assets, tmp_path):
    tb.train_bita(_opts(assets, tmp_path, max_steps=2), log=_quiet)
    logs: list[str] = []
    info = tb.train_bita(_opts(assets, tmp_path, max_steps=3, lr=1e-2, warmup_steps=1), log=logs.append)
    assert not any("resumed from" in m for m in logs) and info["steps"] == 3
    assert any("starting over" in m and "lr, warmup_steps differ" in m for m in logs)
    logs.clear()
    tb.train_bita(_opts(assets, tmp_path, max_steps=4, lr=1e-2, warmup_steps=1), log=logs.append)
    assert any("resumed from" in m and "step 3" in m for m in logs)  # a larger budget alone goes on


def test_bad_options_are_refused(assets, tmp_path):
    with pytest.raises(lm.TrainError, match="--prompt"):
        tb.train_bita(_opts(assets, tmp_path, prompt="wide"))
    with pytest.raises(lm.TrainError, match="--new-tokens"):
        tb.train_bita(_opts(assets, tmp_path, new_tokens=3))
    with pytest.raises(lm.TrainError, match="max-steps"):
        tb.train_bita(_opts(assets, tmp_path, max_steps=None))
