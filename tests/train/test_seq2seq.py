"""The translation recipes on a tiny synthetic parallel corpus in Multi30k's layout: joint tokenizer, `train seq2seq`
(resume, export, card, scores), `train distill` and `train nat`, and the exported pieces running in the loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.drafters import NatDecoder, NatDrafter
from draftverify.methods import MethodOptions, build_verifier
from draftverify.train import nat as nat_recipe, seq2seq
from draftverify.train.settings import TrainError
from draftverify.train.translation_data import train_joint_tokenizer
from parallel_corpus import write_parallel_corpus

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    data = write_parallel_corpus(root)
    info = train_joint_tokenizer(data, root / "tok", vocab_size=300)
    return root, data, info


def _opts(root, data, out, **kw):
    base = dict(
        tokenizer=str(root / "tok"),
        out_dir=str(out),
        data=str(data),
        preset="tiny",
        max_tokens=128,
        max_steps=6,
        threads=1,
        bf16=False,
        warmup_steps=2,
        lr=3e-3,
        log_every=2,
        eval_every_steps=100,
        checkpoint_minutes=1000,
        progress=False,
        bleu_sentences=3,
        max_len=24,
        export_dir=str(out / "export"),
    )
    base.update(kw)
    return seq2seq.Seq2SeqOptions(**base)


def test_tokenizer_ends_sources_with_eos_and_round_trips(corpus):
    from transformers import AutoTokenizer

    root, _, info = corpus
    tok = AutoTokenizer.from_pretrained(str(root / "tok"))
    ids = tok("a man rides a bike.").input_ids
    assert ids[-1] == tok.eos_token_id == info["eos_token_id"]
    assert tok.decode(ids, skip_special_tokens=True) == "a man rides a bike."
    assert tok.decode(tok("straße fährt.").input_ids, skip_special_tokens=True) == "straße fährt."


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    root, data, _ = corpus
    out = tmp_path_factory.mktemp("run")
    report = seq2seq.train(_opts(root, data, out, max_steps=8), log=lambda m: None)
    return root, data, out, report


def test_resume_takes_the_same_steps_as_an_uninterrupted_run(corpus, tmp_path):
    root, data, _ = corpus
    whole = seq2seq.train(_opts(root, data, tmp_path / "a", export=False), log=lambda m: None)
    first = seq2seq.train(_opts(root, data, tmp_path / "b", export=False), log=lambda m: None, stop_after_steps=3)
    assert first["stopped"] and first["step"] == 3
    resumed = seq2seq.train(_opts(root, data, tmp_path / "b", export=False), log=lambda m: None)
    assert resumed["step"] == whole["step"] == 6 and resumed["resumes"] == 1
    assert resumed["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-5)


def test_export_card_and_scores(trained):
    from transformers import AutoModelForSeq2SeqLM

    _, _, out, report = trained
    export = out / "export"
    model = AutoModelForSeq2SeqLM.from_pretrained(str(export))
    assert type(model).__name__ == "MarianMTModel" and next(model.parameters()).dtype == torch.float16
    assert set(report["scores"]) == {"val", "test_2016_flickr"}
    assert not Path(report["data"]).is_absolute()  # no path of the machine that trained it
    assert all(0 <= s["bleu"] <= 100 and s["sentences"] == 6 for s in report["scores"].values())
    card = (export / "README.md").read_text()
    assert "Flickr30k" in card and "research" in card  # the data's terms, on every card
    assert "test_2016_flickr" in card and json.loads((export / "training_report.json").read_text())["step"] == 8


def test_hf_generate_equals_our_autoregressive_loop(trained):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    _, _, out, _ = trained
    tok = AutoTokenizer.from_pretrained(str(out / "export"))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(out / "export"), dtype=torch.float32).eval()
    ids = tok("the dog walks on the street.", return_tensors="pt").input_ids
    hf = model.generate(ids, max_new_tokens=12, do_sample=False)[0, 1:].tolist()
    from draftverify.drafters.base import NoDrafter

    ours = (
        generate(
            model,
            NoDrafter(),
            build_verifier("exact", SamplingParams(), MethodOptions()),
            ids,
            max_new_tokens=12,
            eos_token_id=tok.eos_token_id,
        )
        .new_tokens[0]
        .tolist()
    )
    assert ours == hf[: len(ours)]


def test_distill_and_nat_recipe(trained, tmp_path):
    root, data, out, _ = trained
    target = str(out / "export")
    distilled = tmp_path / "train.de"
    assert nat_recipe.distill(target, str(data), "train", str(distilled), chunk=32, log=lambda m: None) == 80
    assert distilled.read_text(encoding="utf-8").count("\n") == 80
    assert nat_recipe.distill(target, str(data), "train", str(distilled), log=lambda m: None) == 80  # resumed: done
    opts = nat_recipe.NatOptions(
        target=target,
        out_dir=str(tmp_path / "nat-run"),
        train_targets=str(distilled),
        export_dir=str(tmp_path / "nat"),
        data=str(data),
        block_size=3,
        layers=1,
        max_tokens=128,
        max_steps=4,
        threads=1,
        bf16=False,
        warmup_steps=1,
        eval_every_steps=100,
        checkpoint_minutes=1000,
        progress=False,
        log_every=2,
    )
    report = nat_recipe.train(opts, log=lambda m: None)
    assert report["step"] == 4 and 0 <= report["accepted_per_block"] <= 3
    nat = NatDecoder.load(tmp_path / "nat")
    assert nat.config.block_size == 3
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 12, 0]])
    ref = generate(
        model,
        NatDrafter(NatDecoder.load(tmp_path / "nat")),
        build_verifier("greedy", SamplingParams(), MethodOptions()),
        ids,
        max_new_tokens=10,
        gamma=3,
        eos_token_id=0,
    ).new_tokens
    from draftverify.drafters.base import NoDrafter

    plain = generate(
        model,
        NoDrafter(),
        build_verifier("greedy", SamplingParams(), MethodOptions()),
        ids,
        max_new_tokens=10,
        eos_token_id=0,
    ).new_tokens
    assert torch.equal(ref, plain)


def test_clear_errors(corpus, tmp_path):
    root, data, _ = corpus
    with pytest.raises(TrainError, match="not found.*--data"):
        seq2seq.train(_opts(root, tmp_path, tmp_path / "x"), log=lambda m: None)
    with pytest.raises(TrainError, match="translate-tokenizer"):
        seq2seq.train(_opts(root, data, tmp_path / "x", tokenizer=str(tmp_path)), log=lambda m: None)
    with pytest.raises(TrainError, match="unknown preset"):
        seq2seq.train(_opts(root, data, tmp_path / "x", preset="huge"), log=lambda m: None)
    with pytest.raises(DraftVerifyError, match="no NAT drafter"):
        NatDecoder.load(tmp_path)


def test_init_from_continues_an_exported_model(trained, tmp_path):
    """BiLD's prediction alignment path: a fine-tune that starts from the exported weights, not a fresh init."""
    from transformers import AutoModelForSeq2SeqLM

    root, data, out, _ = trained
    report = seq2seq.train(
        _opts(root, data, tmp_path / "ft", init_from=str(out / "export"), max_steps=1, lr=1e-9, warmup_steps=0),
        log=lambda m: None,
    )
    assert report["init_from"] == str(out / "export")
    before = AutoModelForSeq2SeqLM.from_pretrained(str(out / "export")).state_dict()
    after = AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "ft" / "export")).state_dict()
    assert all(torch.allclose(before[k].float(), after[k].float(), atol=1e-2) for k in before)
    with pytest.raises(TrainError, match="--init-from"):
        seq2seq.train(_opts(root, data, tmp_path / "bad", init_from=str(tmp_path)), log=lambda m: None)


def test_read_targets_keeps_exactly_the_written_lines(tmp_path):
    from draftverify.train.translation_data import read_targets

    (tmp_path / "t.de").write_text("ein mann.\n\nein hund.\n", encoding="utf-8")  # an empty translation is a line
    assert read_targets(tmp_path / "t.de", 10) == ["ein mann.", "", "ein hund."]
    assert read_targets(tmp_path / "t.de", 2) == ["ein mann.", ""]
    (tmp_path / "e.de").write_text("", encoding="utf-8")
    assert read_targets(tmp_path / "e.de", 5) == []


def test_cli_alignment_fine_tune_learns_the_given_train_targets(trained, tmp_path):
    """BiLD prediction alignment as `train seq2seq --init-from MODEL --train-targets FILE`: the fine-tune learns the
    file's sentences, not the references (here one constant sentence for a prefix of the train sources, which is
    what a partly written `train distill` file gives)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    root, data, out, _ = trained
    targets = tmp_path / "train.de"
    targets.write_text("ein hund.\n" * 40, encoding="utf-8")
    export = tmp_path / "aligned"
    result = CliRunner().invoke(
        train_app,
        [
            "seq2seq",
            "--out",
            str(tmp_path / "run"),
            "--export",
            str(export),
            "--tokenizer",
            str(root / "tok"),
            "--data",
            str(data),
            "--preset",
            "tiny",
            "--init-from",
            str(out / "export"),
            "--train-targets",
            str(targets),
            "--max-steps",
            "60",
            "--lr",
            "1e-2",
            "--warmup-steps",
            "2",
            "--label-smoothing",
            "0",
            "--max-tokens",
            "128",
            "--threads",
            "1",
            "--no-bf16",
            "--eval-every",
            "1000",
            "--bleu-sentences",
            "3",
            "--checkpoint-minutes",
            "1000",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "has 40 of the 80 train targets" in result.output
    report = json.loads((export / "training_report.json").read_text())
    assert report["train_pairs"] == 40 and report["train_targets"] == str(targets)
    assert report["init_from"] == str(out / "export")
    tok = AutoTokenizer.from_pretrained(str(export))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(export), dtype=torch.float32).eval()
    hyp = seq2seq.translate(model, tok, ["a red dog walks.", "the man rides a bike on the street."], max_len=12)
    assert hyp == ["ein hund.", "ein hund."]
    assert "distillation" in (export / "README.md").read_text()


def test_card_of_an_aligned_model_reports_bild_before_and_after(trained):
    """scripts/zoo_cards.py translate attaches reproduce specdec's before / after figures to draft-aligned's report; the
    card prints both small models' fewest large-model calls (a missing operating point as '-')."""
    from draftverify.train.seq2seq_card import model_card

    _, _, out, _ = trained
    report = json.loads((out / "export" / "training_report.json").read_text())
    bench = {
        "command": "draftverify reproduce specdec --counts-only",
        "sentences": 100,
        "prompts": "multi30k:test",
        "name": "translate-bild-aligned",
        "aligned": {
            "greedy_bleu": 23.4,
            "fewest_target_calls": {
                "bild": {"no_loss": 12.5, "within_1_bleu": None},
                "bild_aligned": {"no_loss": 9.25, "within_1_bleu": 7.0},
            },
        },
    }
    card = model_card({**report, "role": "small-aligned", "bild_alignment": bench})
    assert "| original (`draft`) | 12.50 | - |" in card and "| aligned (this model) | 9.25 | 7.00 |" in card
    assert "benchmarks/translation/translate-bild-aligned.md" in card
    assert "BiLD with this model" not in model_card({**report, "bild_alignment": {"aligned": {}}})
