import json

import pytest
from checkpoints import assert_same_run, optimizer_state, weights
from tiny_corpus import write_tiny_corpus

from draftverify.train import lm
from draftverify.train.tokenizer import build_tokenizer_from_corpus

torch = pytest.importorskip("torch")

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    root = write_tiny_corpus(tmp / "lib", n_files=24, repeat=4)
    info = build_tokenizer_from_corpus(tmp / "tok", tmp / "manifest.json", vocab_size=300, root=root, val_fraction=0.3)
    assert info["counts"]["val"] > 0 and info["counts"]["train"] > 0
    return tmp


def _opts(assets, out, **kw):
    base = dict(
        tokenizer=str(assets / "tok"),
        manifest=str(assets / "manifest.json"),
        out_dir=str(out),
        cache_dir=str(assets / "cache"),
        preset="tiny",
        seq_len=32,
        batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        max_steps=6,
        threads=1,
        bf16=False,
        val_windows=8,
        log_every=1,
        eval_every_steps=100,
        checkpoint_minutes=1000,
        progress=False,
        export=False,
        config_overrides=dict(TINY),
    )
    base.update(kw)
    return lm.TrainOptions(**base)


def _quiet(msg):
    pass


def test_loss_decreases(assets, tmp_path):
    opts = _opts(assets, tmp_path / "run", max_steps=60, eval_every_steps=30, warmup_steps=5)
    summary = lm.train(opts, log=_quiet)
    recs = [json.loads(l) for l in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    train_losses = [r["train_loss"] for r in recs if r.get("train_loss") is not None]
    assert summary["step"] == 60
    assert len(train_losses) == 60
    import math

    assert train_losses[0] > math.log(300) - 1.0  # starts near uniform
    assert sum(train_losses[-5:]) / 5 < train_losses[0] - 1.5
    vals = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    assert len(vals) >= 2 and vals[-1] < train_losses[0] - 1.0
    for r in recs:
        assert {"step", "elapsed", "train_loss", "val_loss", "lr", "tokens_seen"} <= set(r)
    assert recs[-1]["tokens_seen"] == 60 * 4 * 32


def test_resume_matches_uninterrupted(assets, tmp_path):
    ref = lm.train(_opts(assets, tmp_path / "ref"), log=_quiet)
    assert ref["step"] == 6

    out = tmp_path / "resumed"
    part = lm.train(_opts(assets, out), log=_quiet, stop_after_steps=3)
    assert part["stopped"] and part["step"] == 3
    mid = lm.load_checkpoint(out)
    assert mid["state"]["step"] == 3 and mid["state"]["tokens_seen"] == 3 * 4 * 32
    assert not mid["state"]["finished"]
    assert len(optimizer_state(out)["state"]) > 0

    msgs = []
    full = lm.train(_opts(assets, out), log=msgs.append)
    assert any("resumed" in m and "step 3" in m for m in msgs)
    assert full["step"] == 6
    res_ckpt = lm.load_checkpoint(out)
    assert res_ckpt["state"]["resumes"] == 1
    assert_same_run(tmp_path / "ref", out)  # weights and optimizer moments
    assert lm.load_checkpoint(tmp_path / "ref")["state"]["val_loss"] == pytest.approx(
        res_ckpt["state"]["val_loss"], abs=0
    )
    # the log covers steps 1..6 exactly once
    steps = [
        json.loads(l)["step"]
        for l in (out / "log.jsonl").read_text().splitlines()
        if json.loads(l).get("train_loss") is not None
    ]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_export_and_init_from(assets, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exp = tmp_path / "export"
    s = lm.train(
        _opts(
            assets,
            tmp_path / "run",
            max_steps=4,
            export=True,
            export_dir=str(exp),
            command="draftverify train lm --preset tiny",
        ),
        log=_quiet,
    )
    assert (exp / "model.safetensors").is_file()
    card = (exp / "README.md").read_text()
    assert f"{s['params']:,}" in card
    assert "draftverify train lm --preset tiny" in card
    assert s["manifest_hash"] in card
    assert "held-out loss" in card
    tok = AutoTokenizer.from_pretrained(str(exp))
    from safetensors import safe_open

    with safe_open(str(exp / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    model = AutoModelForCausalLM.from_pretrained(str(exp), dtype="auto")
    assert model.dtype == torch.float16
    assert json.loads((exp / "generation_config.json").read_text())["pad_token_id"] == tok.pad_token_id
    assert model.config.tie_word_embeddings and model.config.eos_token_id == tok.eos_token_id
    assert lm.count_params(model) == s["params"]
    # the fp16 weights are the trained ones
    w = weights(tmp_path / "run")["model.embed_tokens.weight"]
    assert torch.allclose(model.model.embed_tokens.weight.float(), w, atol=1e-2)
    ids = tok("def add(a, b):\n", return_tensors="pt")["input_ids"]
    out = model.float().generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5 or tok.eos_token_id in out[0].tolist()

    # continue from the export with a fresh optimizer
    s2 = lm.train(_opts(assets, tmp_path / "cont", init_from=str(exp), max_steps=2), log=_quiet)
    assert s2["step"] == 2 and s2["params"] == s["params"]
    assert "init" in s2["preset"]


def test_clear_errors(assets, tmp_path):
    with pytest.raises(lm.TrainError, match="tokenizer"):
        lm.train(_opts(assets, tmp_path / "a", tokenizer=str(tmp_path / "missing")), log=_quiet)
    with pytest.raises(lm.TrainError, match="manifest"):
        lm.train(_opts(assets, tmp_path / "a", manifest=str(tmp_path / "missing.json")), log=_quiet)
    with pytest.raises(lm.TrainError, match="unknown preset"):
        lm.train(_opts(assets, tmp_path / "a", preset="giant"), log=_quiet)
    with pytest.raises(lm.TrainError, match="max-steps"):
        lm.train(_opts(assets, tmp_path / "a", max_steps=None, max_minutes=None), log=_quiet)
    with pytest.raises(lm.TrainError, match="seq-len"):
        lm.train(_opts(assets, tmp_path / "a", seq_len=4096), log=_quiet)


def test_cli_errors(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    r = CliRunner().invoke(
        train_app,
        [
            "lm",
            "--tokenizer",
            str(tmp_path / "nope"),
            "--manifest",
            str(assets / "manifest.json"),
            "--out",
            str(tmp_path / "o"),
            "--max-steps",
            "1",
        ],
    )
    assert r.exit_code == 2
    assert "tokenizer" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(
        train_app,
        [
            "lm",
            "--tokenizer",
            str(assets / "tok"),
            "--manifest",
            str(assets / "manifest.json"),
            "--out",
            str(tmp_path / "o"),
            "--preset",
            "giant",
            "--max-steps",
            "1",
        ],
    )
    assert r.exit_code == 2 and "unknown preset" in r.output


def test_cli_tokenizer_and_lm(tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    root = write_tiny_corpus(tmp_path / "lib", n_files=30, repeat=2)
    r = CliRunner().invoke(
        train_app,
        [
            "tokenizer",
            "--out",
            str(tmp_path / "zoo" / "tokenizer"),
            "--vocab-size",
            "300",
            "--root",
            str(root),
            "--val-fraction",
            "0.3",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "zoo" / "manifest.json").is_file()
    r = CliRunner().invoke(
        train_app,
        [
            "lm",
            "--tokenizer",
            str(tmp_path / "zoo" / "tokenizer"),
            "--manifest",
            str(tmp_path / "zoo" / "manifest.json"),
            "--preset",
            "tiny",
            "--out",
            str(tmp_path / "run"),
            "--export",
            str(tmp_path / "zoo" / "tiny"),
            "--max-steps",
            "3",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--threads",
            "1",
            "--no-bf16",
            "--val-windows",
            "2",
            "--no-progress",
            "--log-every",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "zoo" / "tiny" / "config.json").is_file()
    assert "step      3" in r.output


def test_early_exit_phase_resumes_exactly_and_reports(assets, tmp_path):
    ee = dict(
        config_overrides=dict(TINY, num_hidden_layers=3),
        max_steps=16,
        warmup_steps=2,
        early_exit_layer=1,
        early_exit_share=0.5,
        max_degradation=10.0,
    )
    ref = lm.train(_opts(assets, tmp_path / "ref", **ee), log=_quiet)
    out = tmp_path / "run"
    assert lm.train(_opts(assets, out, **ee), log=_quiet, stop_after_steps=5)["stopped"]  # inside the plain phase
    part = lm.train(_opts(assets, out, **ee), log=_quiet, stop_after_steps=6)  # across the switch at step 8
    assert part["stopped"] and part["step"] == 11
    assert (out / "before-early-exit.pt").is_file()
    full = lm.train(_opts(assets, out, **ee, export=True, export_dir=str(tmp_path / "exp")), log=_quiet)
    assert_same_run(tmp_path / "ref", out)
    phase = full["early_exit"]
    assert phase == ref["early_exit"]
    assert phase["from_step"] == 8 and phase["layer"] == 1 and phase["kept"]
    assert phase["after"]["early"] < phase["before"]["early"]  # the averaged loss trained layer 1
    assert full["val_loss"] == pytest.approx(phase["after"]["full"], abs=1e-6)
    assert "Early-exit phase (BiLD section 4.4) from step 8" in (tmp_path / "exp" / "README.md").read_text()


def test_early_exit_phase_is_dropped_when_the_full_model_degrades(assets, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    real, calls = lm.held_out_losses, []

    def worse_after(*args, **kw):  # the tiny model still improves in any phase: report the phase as costly
        full, early = real(*args, **kw)
        calls.append(full)
        return (full + 1.0 if len(calls) == 2 else full), early

    monkeypatch.setattr(lm, "held_out_losses", worse_after)
    run, exp = tmp_path / "run", tmp_path / "exp"
    s = lm.train(
        _opts(
            assets,
            run,
            config_overrides=dict(TINY, num_hidden_layers=3),
            max_steps=12,
            warmup_steps=2,
            early_exit_layer=2,
            early_exit_share=0.5,
            export=True,
            export_dir=str(exp),
        ),
        log=_quiet,
    )
    phase = s["early_exit"]
    assert len(calls) == 2 and not phase["kept"]
    assert s["val_loss"] == phase["before"]["full"] == calls[0]
    # the exported weights are those from before the phase, not the trained-on ones of the checkpoint
    snap = torch.load(run / "before-early-exit.pt")
    last = weights(run)
    exported = load_file(str(exp / "model.safetensors"))
    w = "model.layers.0.mlp.up_proj.weight"
    assert torch.allclose(exported[w].float(), snap[w], atol=1e-3)
    assert not torch.allclose(exported[w].float(), last[w], atol=1e-3)
    assert "dropped" in (exp / "README.md").read_text()
    with pytest.raises(lm.TrainError, match=r"--early-exit-layer must be in \[1, 1\]"):
        lm.train(_opts(assets, tmp_path / "bad", early_exit_layer=2), log=_quiet)
    with pytest.raises(lm.TrainError, match="--early-exit-share"):
        lm.train(_opts(assets, tmp_path / "bad", early_exit_layer=1, early_exit_share=1.0), log=_quiet)
