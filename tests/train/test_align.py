"""`draftverify train align` (BiLD prediction alignment) on a tiny setup: a deterministic target (a tiny LM
trained for a few seconds on a tiny corpus, decoded greedily) and a randomly initialised draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_corpus import tiny_llama, train_tiny_target

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import align as al, lm  # noqa: E402

TINY = tiny_llama()


def _quiet(msg):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from transformers import LlamaForCausalLM

    from draftverify.train.tokenizer import load_tokenizer

    tmp = train_tiny_target(tmp_path_factory.mktemp("align"))
    tok = load_tokenizer(tmp / "tok")
    # the draft: randomly initialised, same tokenizer
    torch.manual_seed(1)
    lm.export_model(
        LlamaForCausalLM(lm.make_config("tiny", len(tok), tok.eos_token_id, **TINY)), tok, tmp / "draft", "random draft"
    )
    # a draft with another vocabulary
    lm.export_model(
        LlamaForCausalLM(lm.make_config("tiny", len(tok) + 20, tok.eos_token_id, **TINY)),
        tok,
        tmp / "draft-other-vocab",
        "wrong vocab",
    )
    return tmp


def _opts(assets, tmp_path, **kw) -> al.AlignOptions:
    base = dict(
        target=str(assets / "target"),
        draft=str(assets / "draft"),
        manifest=str(assets / "manifest.json"),
        out_dir=str(tmp_path / "aligned"),
        work_dir=str(tmp_path / "work"),
        num_prompts=24,
        eval_prompts=8,
        min_prompt_tokens=8,
        max_prompt_tokens=24,
        new_tokens=32,
        gamma=5,
        max_steps=60,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        threads=1,
        bf16=False,
        log_every=1000,
        progress=False,
        command="draftverify train align --test",
    )
    base.update(kw)
    return al.AlignOptions(**base)


def _models(assets):
    from draftverify.api import load_model

    return load_model(assets / "target", "float32"), load_model(assets / "draft", "float32", role="draft")


def _header(**kw):
    h = {
        "type": "header",
        "version": al.CACHE_VERSION,
        "kind": "calibration",
        "split": "train",
        "target_sha256": "t",
        "new_tokens": 16,
        "vocab_size": 300,
        "eos_token_id": 0,
    }
    h.update(kw)
    return h


# ---------------------------------------------------------------- prompts


def test_prompts_start_at_lines_and_are_reproducible(assets):
    from draftverify.train import corpus
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    m = corpus.load_manifest(assets / "manifest.json")
    prompts = al.sample_prompts(m, tok, "train", 12, 8, 24, seed=3)
    assert len(prompts) == 12
    val_files = {f["path"] for f in m["files"] if f["split"] == "val"}
    for p in prompts:
        assert 8 <= len(p["prompt"]) <= 24
        path, line = p["source"].rsplit(":", 1)
        assert path not in val_files
        text = (Path(m["root"]) / path).read_text()
        rest = "\n".join(text.split("\n")[int(line) - 1 :])
        assert rest.startswith(tok.decode(p["prompt"]))  # starts at the beginning of that line
        assert not rest[0].isspace()
    assert al.sample_prompts(m, tok, "train", 5, 8, 24, seed=3) == prompts[:5]  # prefix-stable
    assert al.sample_prompts(m, tok, "train", 5, 8, 24, seed=4) != prompts[:5]
    held = al.sample_prompts(m, tok, "val", 4, 8, 24, seed=3)
    assert all(p["source"].rsplit(":", 1)[0] in val_files for p in held)


# ---------------------------------------------------------------- step 1: generation


def test_generation_is_exactly_the_targets_greedy_output(assets, tmp_path):
    from draftverify.backends.hf.cached_lm import CachedLM
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    target, draft = _models(assets)
    prompts = al.sample_prompts(assets / "manifest.json", tok, "train", 6, 8, 24, seed=0)
    recs = al.greedy_continuations(
        tmp_path / "g.jsonl",
        _header(),
        prompts,
        CachedLM(target),
        draft,
        4,
        16,
        tok.eos_token_id,
        desc="test",
        log=_quiet,
    )
    assert len(recs) == 6
    for p, r in zip(prompts, recs):
        ids = torch.tensor([p["prompt"]])
        ref = target.generate(
            ids, max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id
        )
        assert r["continuation"] == ref[0, ids.shape[1] :].tolist()
        assert r["prompt"] == p["prompt"] and r["source"] == p["source"]
        assert r["stats"]["new_tokens"] == len(r["continuation"])
    header, again = al.read_generations(tmp_path / "g.jsonl")
    assert header["kind"] == "calibration" and again == recs


def test_generation_cache_resumes(assets, tmp_path, monkeypatch):
    import draftverify.loop
    from draftverify.backends.hf.cached_lm import CachedLM
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    target, draft = _models(assets)
    prompts = al.sample_prompts(assets / "manifest.json", tok, "train", 5, 8, 24, seed=0)
    path = tmp_path / "g.jsonl"
    first = al.greedy_continuations(
        path, _header(), prompts[:3], CachedLM(target), draft, 4, 16, 0, desc="t", log=_quiet
    )
    calls = []
    real = draftverify.loop.generate

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(draftverify.loop, "generate", counting)
    with open(path, "a") as fh:
        fh.write('{"i": 3, "prompt": [1, 2, 3')  # a write interrupted by a crash
    msgs = []
    recs = al.greedy_continuations(
        path, _header(), prompts, CachedLM(target), draft, 4, 16, 0, desc="t", log=msgs.append
    )
    assert len(calls) == 2  # only the two missing prompts were generated
    assert any("reusing 3" in m for m in msgs)
    assert recs[:3] == first and [r["i"] for r in recs] == [0, 1, 2, 3, 4]
    assert al.read_generations(path)[1] == recs  # the broken line is gone
    # fully cached: nothing runs, not even the models
    assert al.greedy_continuations(path, _header(), prompts, None, None, 4, 16, 0, desc="t", log=_quiet) == recs
    assert al.greedy_continuations(path, _header(), prompts[:2], None, None, 4, 16, 0, desc="t", log=_quiet) == recs[:2]
    assert len(calls) == 2
    # a cache made with other settings is never silently reused
    with pytest.raises(al.AlignError, match="new_tokens"):
        al.greedy_continuations(
            path, _header(new_tokens=8), prompts, CachedLM(target), draft, 4, 8, 0, desc="t", log=_quiet
        )
    other = al.sample_prompts(assets / "manifest.json", tok, "train", 5, 8, 24, seed=99)
    with pytest.raises(al.AlignError, match="prompts"):
        al.greedy_continuations(path, _header(), other, CachedLM(target), draft, 4, 16, 0, desc="t", log=_quiet)
    recs8 = al.greedy_continuations(
        path,
        _header(new_tokens=8),
        prompts[:2],
        CachedLM(target),
        draft,
        4,
        8,
        0,
        desc="t",
        reset_on_mismatch=True,
        log=_quiet,
    )
    assert len(calls) == 4 and all(len(r["continuation"]) <= 8 for r in recs8)


# ---------------------------------------------------------------- the whole recipe


def test_align_end_to_end(assets, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    opts = _opts(assets, tmp_path)
    part = al.align(opts, log=_quiet, stop_after_steps=25)  # interrupted fine-tune: checkpoint, no export
    assert part["stopped"] and part["step"] == 25
    assert not (tmp_path / "aligned").exists()
    msgs = []
    info = al.align(_opts(assets, tmp_path), log=msgs.append)
    assert any("reusing 24" in m for m in msgs) and any("reusing 8" in m for m in msgs)  # step 1 cached
    assert any("resumed" in m and "step 25" in m for m in msgs)
    ft = info["finetune"]
    assert ft["step"] == 60 and ft["resumes"] == 1
    # the fine-tune fits the target's continuations, on the calibration set and on held-out prompts
    assert ft["train_loss_after"] < ft["train_loss_before"] - 1.0
    assert ft["heldout_loss"] < ft["heldout_loss_before"]
    # alignment helps: the random draft agrees with the target far more often afterwards
    before, after = info["before"], info["after"]
    assert before["prompts"] == after["prompts"] == 8
    assert after["alpha"] >= before["alpha"]
    assert after["alpha"] > before["alpha"] + 0.1
    assert after["tokens_per_call"] > before["tokens_per_call"]
    assert info["exact_continuations"] == 8  # both runs are the target's greedy text
    # export: fp16 weights + tokenizer, model card and alignment.json with alpha before/after
    out = tmp_path / "aligned"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    assert model.config.vocab_size == 300
    card = (out / "README.md").read_text()
    assert f"{before['alpha']:.3f}" in card and f"{after['alpha']:.3f}" in card
    assert "draftverify train align --test" in card and "prediction alignment" in card
    saved = json.loads((out / "alignment.json").read_text())
    assert saved["after"]["alpha"] == pytest.approx(after["alpha"])
    assert saved["before"]["alpha"] == pytest.approx(before["alpha"])
    assert (tmp_path / "work" / "alignment.json").is_file()
    # the calibration generations feed `train ngram --from-generations`
    from draftverify.train import ngram as ng

    s = ng.build(
        ng.NgramOptions(
            out=str(tmp_path / "ng.safetensors"),
            tokenizer=str(assets / "tok"),
            manifest=str(assets / "manifest.json"),
            from_generations=info["generations"],
        ),
        log=_quiet,
    )
    assert s["tokens"] == info["calibration"]["new_tokens"]


def test_reported_losses_and_alpha_are_those_of_the_original_and_the_exported_draft(assets, tmp_path):
    """The "before" figures are the original draft's and the "after" ones the exported aligned draft's, each
    recomputed here independently (models loaded like draftverify.load, fp32, one sequence per batch so no
    padding). Guards against before and after being computed differently (model mode, attention
    implementation, padding, autocast, records), against a fine-tune that does not reach the exported
    weights, and against "after" being measured on the wrong model."""
    from safetensors.torch import load_file

    from draftverify.api import load_model
    from draftverify.backends.hf.cached_lm import CachedLM

    opts = _opts(
        assets, tmp_path, num_prompts=8, eval_prompts=4, max_steps=10, warmup_steps=2, lr=3e-3, batch_size=16, bf16=True
    )  # bf16 autocast, as the CLI default
    info = al.align(opts, log=_quiet)
    ft, out, work = info["finetune"], tmp_path / "aligned", tmp_path / "work"
    _, calib = al.read_generations(work / "generations.jsonl")
    _, held = al.read_generations(work / "eval_before.jsonl")
    target = load_model(assets / "target", "float32")
    original = load_model(assets / "draft", "float32", role="draft")
    aligned = load_model(out, "float32", role="aligned draft")

    def loss(model, recs):
        return al.evaluate_loss(model, recs, 0, False, 1)

    # bf16 autocast in the run vs fp32 here, and the exported draft is rounded to fp16: small differences only
    tol = dict(rel=5e-3, abs=5e-3)
    before = (loss(original, calib[:64]), loss(original, held))
    after = (loss(aligned, calib[:64]), loss(aligned, held))
    assert before == pytest.approx((ft["train_loss_before"], ft["heldout_loss_before"]), **tol)
    assert after == pytest.approx((ft["train_loss_after"], ft["heldout_loss"]), **tol)
    assert after[0] < before[0] - 0.5  # a real change, far beyond the tolerance
    # right padding without an attention mask and batching do not change the figures
    assert al.evaluate_loss(original, held, 0, False, 16) == pytest.approx(loss(original, held), rel=1e-5)
    # the fine-tuned weights are the exported ones
    a, b = load_file(str(assets / "draft" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys()
    mats = [k for k in a if a[k].dim() == 2]
    assert sum(int((a[k] != b[k]).sum()) for k in mats) > 0.5 * sum(a[k].numel() for k in mats)
    # alpha before is the original draft's and alpha after the exported draft's, on the same held-out prompts
    prompts = [{"prompt": r["prompt"], "source": r["source"]} for r in held]

    def strip(recs):  # the deterministic part of each record's GenerationStats
        return [{k: v for k, v in r["stats"].items() if k != "time_total"} for r in recs]

    def stats(draft, name):
        return strip(
            al.greedy_continuations(
                tmp_path / name,
                {"type": "header"},
                prompts,
                CachedLM(target),
                draft,
                opts.gamma,
                opts.new_tokens,
                0,
                desc=name,
                log=_quiet,
            )
        )

    _, after_recs = al.read_generations(work / "eval_after.jsonl")
    assert [r["prompt"] for r in after_recs] == [p["prompt"] for p in prompts]
    assert strip(held) == stats(original, "orig.jsonl")
    assert strip(after_recs) == stats(aligned, "aligned.jsonl")
    assert strip(after_recs) != strip(held)  # the aligned draft proposes differently
    assert info["after"] == al.summarize(after_recs) and info["before"] == al.summarize(held)


def test_evaluate_loss_restores_the_training_mode(assets):
    from draftverify.api import load_model

    model = load_model(assets / "draft", "float32", role="draft").train()
    recs = [{"prompt": [5, 6, 7], "continuation": [8, 9]}, {"prompt": [10], "continuation": [11, 12, 13]}]
    x, y = al.make_batch(recs, 0)
    with torch.no_grad():
        ref = float(al.continuation_loss(model, x, y, False))
    assert al.evaluate_loss(model, recs, 0, False, 2) == pytest.approx(ref, rel=1e-6)
    assert model.training


def test_loss_is_on_continuation_tokens_only():
    recs = [{"prompt": [1, 2, 3], "continuation": [4, 5]}, {"prompt": [6], "continuation": [7, 8, 9, 10]}]
    x, y = al.make_batch(recs, pad_id=0)
    assert x.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert y.tolist() == [[-100, -100, -100, 4, 5], [-100, 7, 8, 9, 10]]
    recs = [{"prompt": [1], "continuation": [2]}, {"prompt": [3, 4], "continuation": [5, 6]}]
    x, y = al.make_batch(recs, pad_id=0)
    assert x.tolist() == [[1, 2, 0, 0], [3, 4, 5, 6]] and y[0].tolist() == [-100, 2, -100, -100]


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs(assets, tmp_path):
    with pytest.raises(al.AlignError, match="--target .*not found"):
        al.align(_opts(assets, tmp_path, target=str(tmp_path / "missing")), log=_quiet)
    with pytest.raises(al.AlignError, match="--draft .*not found"):
        al.align(_opts(assets, tmp_path, draft=str(tmp_path / "missing")), log=_quiet)
    (tmp_path / "empty").mkdir()
    with pytest.raises(al.AlignError, match="config.json"):
        al.align(_opts(assets, tmp_path, draft=str(tmp_path / "empty")), log=_quiet)
    with pytest.raises(al.AlignError, match="vocabulary mismatch.*300.*320"):
        al.align(_opts(assets, tmp_path, draft=str(assets / "draft-other-vocab")), log=_quiet)
    with pytest.raises(al.AlignError, match="manifest"):
        al.align(_opts(assets, tmp_path, manifest=str(tmp_path / "nope.json")), log=_quiet)
    with pytest.raises(al.AlignError, match="tokenizer"):
        al.align(_opts(assets, tmp_path, tokenizer=str(tmp_path / "empty")), log=_quiet)
    with pytest.raises(al.AlignError, match="max-steps"):
        al.align(_opts(assets, tmp_path, max_steps=None, max_minutes=None), log=_quiet)
    with pytest.raises(al.AlignError, match="max-prompt-tokens"):
        al.align(_opts(assets, tmp_path, min_prompt_tokens=30, max_prompt_tokens=20), log=_quiet)
    with pytest.raises(al.AlignError, match="positions"):
        al.align(_opts(assets, tmp_path, max_prompt_tokens=200, new_tokens=100), log=_quiet)
    assert not (tmp_path / "work").exists()  # nothing was started


def test_cli_align(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    common = [
        "align",
        "--target",
        str(assets / "target"),
        "--manifest",
        str(assets / "manifest.json"),
        "--out",
        str(tmp_path / "aligned"),
        "--work-dir",
        str(tmp_path / "work"),
        "--num-prompts",
        "4",
        "--eval-prompts",
        "2",
        "--min-prompt-tokens",
        "8",
        "--max-prompt-tokens",
        "16",
        "--new-tokens",
        "8",
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--threads",
        "1",
        "--no-bf16",
        "--no-progress",
    ]
    r = CliRunner().invoke(train_app, common + ["--draft", str(assets / "draft-other-vocab")])
    assert r.exit_code == 2 and "vocabulary mismatch" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(train_app, common + ["--draft", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "not found" in r.output
    r = CliRunner().invoke(train_app, common + ["--draft", str(assets / "draft")])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["steps"] == 2 and 0 <= summary["alpha_before"] <= 1 and 0 <= summary["alpha_after"] <= 1
    assert (tmp_path / "aligned" / "alignment.json").is_file()
    assert (tmp_path / "work" / "generations.jsonl").is_file()
