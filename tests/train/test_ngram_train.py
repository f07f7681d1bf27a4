"""`draftverify train ngram`: vectorised counting equals NgramTable.from_sequences, safetensors round trip,
pruning keeps every context's distribution valid, building from target generations, held-out accuracy, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from tiny_corpus import SHORT_SNIPPETS, write_tiny_corpus

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.drafters.ngram import NgramDrafter, NgramTable  # noqa: E402
from draftverify.train import ngram as ng  # noqa: E402
from draftverify.train.lm import TrainError  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from draftverify.train.tokenizer import build_tokenizer_from_corpus

    tmp = tmp_path_factory.mktemp("ngram")
    root = write_tiny_corpus(
        tmp / "lib", n_files=16, repeat=1, snippets=SHORT_SNIPPETS, per_file=3, stride=3, assignments=True, nested=False
    )
    info = build_tokenizer_from_corpus(tmp / "tok", tmp / "manifest.json", vocab_size=300, root=root, val_fraction=0.3)
    assert info["counts"]["val"] > 0 and info["counts"]["train"] > 0
    return tmp


def as_dicts(table: NgramTable) -> dict:
    return {ctx: dict(zip(t.tolist(), c.tolist())) for ctx, (t, c) in table.tables.items()}


def train_docs(assets) -> tuple[list[list[int]], object]:
    from draftverify.train import corpus
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    docs = [
        tok.backend_tokenizer.encode(t, add_special_tokens=False).ids + [tok.eos_token_id]
        for t in corpus.iter_texts(assets / "manifest.json", "train")
    ]
    return docs, tok


def opts(assets, out, **kw) -> ng.NgramOptions:
    base = dict(out=str(out), tokenizer=str(assets / "tok"), manifest=str(assets / "manifest.json"))
    base.update(kw)
    return ng.NgramOptions(**base)


# ---------------------------------------------------------------- counting


@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_from_sequences_random(seed):
    rng = random.Random(seed)
    vocab = rng.choice([4, 11, 300, 8192])
    order = rng.choice([2, 3, 4])
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 40))] for _ in range(rng.randint(1, 6))]
    seqs.append([rng.randrange(vocab) for _ in range(5)])
    got = ng.count_sequences(seqs, order, vocab, min_count=1, top_k=10**6)
    assert as_dicts(got.to_table()) == as_dicts(NgramTable.from_sequences(seqs, order, vocab))
    assert got.tokens_counted == sum(map(len, seqs))


def test_known_counts_and_order_of_next_tokens():
    got = ng.count_sequences([[1, 2, 3, 1, 2, 4]], 3, 10, min_count=1, top_k=10)
    t = got.to_table()
    assert as_dicts(t) == {
        (): {1: 2, 2: 2, 3: 1, 4: 1},
        (1,): {2: 2},
        (2,): {3: 1, 4: 1},
        (3,): {1: 1},
        (1, 2): {3: 1, 4: 1},
        (2, 3): {1: 1},
        (3, 1): {2: 1},
    }
    # next tokens by count descending, then id ascending: the first one is the greedy drafter's choice
    assert t.tables[()][0].tolist() == [1, 2, 3, 4]
    assert got.levels[1].best.tolist() == [2, 3, 1]


def test_save_load_round_trip(tmp_path):
    seqs = [[5, 6, 7, 5, 6, 8, 5, 6, 7], [7, 7, 7, 1]]
    got = ng.count_sequences(seqs, 3, 16, min_count=1, top_k=10)
    size = got.save(tmp_path / "t.safetensors", metadata={"note": "x", "n": 3})
    assert size == (tmp_path / "t.safetensors").stat().st_size
    loaded = NgramTable.load(tmp_path / "t.safetensors")
    assert loaded.order == 3 and loaded.vocab_size == 16
    assert as_dicts(loaded) == as_dicts(NgramTable.from_sequences(seqs, 3, 16))
    # the same file NgramTable.save would write, as far as NgramTable.load can tell
    NgramTable.from_sequences(seqs, 3, 16).save(tmp_path / "ref.safetensors")
    assert as_dicts(NgramTable.load(tmp_path / "ref.safetensors")) == as_dicts(loaded)


def test_bad_arguments():
    with pytest.raises(TrainError, match="order"):
        ng.count_sequences([[1, 2]], 1, 10)
    with pytest.raises(TrainError, match="outside the vocabulary"):
        ng.count_sequences([[1, 12]], 3, 10)
    with pytest.raises(TrainError, match="top-k"):
        ng.count_sequences([[1, 2]], 3, 10, top_k=0)
    with pytest.raises(TrainError, match="min-count"):
        ng.count_sequences([[1, 2]], 3, 10, min_count=0)
    with pytest.raises(TrainError, match="empty"):
        ng.count_sequences([[]], 3, 10)
    with pytest.raises(TrainError, match="bits"):
        ng.count_sequences([[1, 2]], 5, 65536)


# ---------------------------------------------------------------- pruning


def test_pruning_keeps_valid_distributions():
    rng = np.random.default_rng(0)
    seqs = [rng.zipf(1.3, size=int(rng.integers(20, 200))).clip(1, 60).tolist() for _ in range(40)]
    full = as_dicts(ng.count_sequences(seqs, 3, 64, min_count=1, top_k=10**6).to_table())
    pruned_counts = ng.count_sequences(seqs, 3, 64, min_count=3, top_k=2)
    pruned = pruned_counts.to_table()
    got = as_dicts(pruned)
    assert got[()] == full[()]  # the unigram is never pruned: every token seen keeps its count
    assert set(got) < set(full)
    for ctx, dist in got.items():
        assert 1 <= len(dist) <= (len(full[()]) if ctx == () else 2)
        if ctx:
            assert sum(full[ctx].values()) >= 3  # context seen at least min_count times
            assert ctx[1:] in got  # suffix-closed: backoff never skips a level
        # the kept next tokens are the most frequent ones, with their original counts
        best = sorted(full[ctx].items(), key=lambda kv: (-kv[1], kv[0]))[: len(dist)]
        assert dict(best) == dist
    for ctx, dist in full.items():
        if ctx and sum(dist.values()) >= 3:
            assert ctx in got
    # every context, seen or not, gets a proper distribution from the drafter
    drafter = NgramDrafter(pruned)
    from draftverify.types import DecodingState, SamplingParams

    gen = torch.Generator().manual_seed(0)
    for context in ([1, 2], [63, 63], [7], [1, 1, 1, 1], [5, 9, 2]):
        for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=0)):
            state = DecodingState(torch.tensor([context]), None, len(context), params, None if params.greedy else gen)
            draft = drafter.propose(state, 4)
            assert draft.tokens.shape == (1, 4)
            assert torch.allclose(draft.q_probs.sum(-1), torch.ones(1, 4, dtype=draft.q_probs.dtype))
            assert int(draft.tokens.max()) < 64


# ---------------------------------------------------------------- from the corpus


def test_build_from_corpus_counts_and_round_trip(assets, tmp_path):
    docs, tok = train_docs(assets)
    logs = []
    s = ng.build(opts(assets, tmp_path / "t.safetensors", min_count=1, top_k=10**6), log=logs.append)
    table = NgramTable.load(tmp_path / "t.safetensors")
    assert table.order == 3 and table.vocab_size == len(tok)
    assert as_dicts(table) == as_dicts(NgramTable.from_sequences(docs, 3, len(tok)))
    assert s["tokens"] == sum(map(len, docs))
    assert s["contexts"] == len(table.tables)
    assert s["bytes"] == (tmp_path / "t.safetensors").stat().st_size
    assert 0.0 < s["val_top1_accuracy"] <= 1.0 and s["val_tokens"] > 0
    assert any("accuracy" in m for m in logs) and any("contexts" in m for m in logs)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["order"] == "3" and "min_count" in meta and "val_top1_accuracy" in meta


def test_default_pruning_is_smaller_and_token_cache_is_shared(assets, tmp_path):
    full = ng.build(opts(assets, tmp_path / "full.safetensors", min_count=1, top_k=10**6), log=lambda m: None)
    small = ng.build(
        opts(assets, tmp_path / "small.safetensors", cache_dir=str(tmp_path / "cache")), log=lambda m: None
    )
    assert small["contexts"] < full["contexts"] and small["bytes"] < full["bytes"]
    assert list((tmp_path / "cache").glob("*/train.u16.npy"))  # the same cache `train lm` uses
    again = ng.build(
        opts(assets, tmp_path / "again.safetensors", cache_dir=str(tmp_path / "cache")), log=lambda m: None
    )
    assert again["contexts"] == small["contexts"]
    part = ng.build(opts(assets, tmp_path / "part.safetensors", max_tokens=200, min_count=1), log=lambda m: None)
    assert part["tokens"] == 200


def test_accuracy_is_the_drafters_greedy_choice(assets, tmp_path):
    """predict() (vectorised, used for the held-out figure) equals NgramDrafter's backoff + argmax."""
    from draftverify.train import corpus

    _, tok = train_docs(assets)
    ng.build(opts(assets, tmp_path / "t.safetensors", min_count=2, top_k=3), log=lambda m: None)
    table = NgramTable.load(tmp_path / "t.safetensors")
    counts = ng.count_ngrams(*_flat(train_docs(assets)[0]), 3, len(tok), min_count=2, top_k=3)
    val_docs = [
        tok.backend_tokenizer.encode(t, add_special_tokens=False).ids + [tok.eos_token_id]
        for t in corpus.iter_texts(assets / "manifest.json", "val")
    ]
    flat, seg = _flat(val_docs)
    pred = counts.predict(flat, seg)
    hits = n = 0
    off = 0
    for doc in val_docs:
        for i in range(len(doc)):
            ids, cnt = table.next_counts(doc[max(0, i - 2) : i])
            dense = torch.zeros(table.vocab_size)
            dense[ids] = cnt
            choice = int(dense.argmax())
            assert pred[off + i] == choice
            hits += choice == doc[i]
            n += 1
        off += len(doc)
    acc, judged = counts.accuracy(flat, seg)
    assert judged == n and acc == pytest.approx(hits / n)


def _flat(docs):
    seg, _ = ng.segment_starts(len(d) for d in docs)
    return np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]), seg


# ---------------------------------------------------------------- from target generations


def write_generations(path: Path, records: list[tuple[list[int], list[int]]], vocab: int) -> None:
    with open(path, "w") as fh:
        fh.write(
            json.dumps({"type": "header", "version": 1, "kind": "calibration", "vocab_size": vocab, "target": "t"})
            + "\n"
        )
        for i, (p, c) in enumerate(records):
            fh.write(json.dumps({"i": i, "source": "x.py:1", "prompt": p, "continuation": c}) + "\n")


def test_from_generations_counts_continuation_tokens_only(assets, tmp_path):
    recs = [([1, 2, 3], [4, 5, 4, 5]), ([9, 9], [4, 5, 6]), ([7], [1])]
    path = tmp_path / "gen.jsonl"
    write_generations(path, recs, 12)
    with open(path, "a") as fh:
        fh.write('{"i": 3, "prompt": [1, 2')  # an interrupted write is ignored
    s = ng.build(
        opts(
            assets,
            tmp_path / "g.safetensors",
            from_generations=str(path),
            min_count=1,
            top_k=100,
            eval_generations=str(path),
            evaluate=False,
        ),
        log=lambda m: None,
    )
    expected: dict = {}
    for p, c in recs:
        seq = p + c
        for i in range(len(p), len(seq)):
            for k in range(0, min(2, i) + 1):
                d = expected.setdefault(tuple(seq[i - k : i]), {})
                d[seq[i]] = d.get(seq[i], 0) + 1
    table = NgramTable.load(tmp_path / "g.safetensors")
    assert table.vocab_size == 12  # from the generations header
    assert as_dicts(table) == expected
    assert s["tokens"] == sum(len(c) for _, c in recs)
    assert s["source"]["records"] == 3
    assert 0.0 <= s["generations_top1_accuracy"] <= 1.0 and s["generations_tokens"] == s["tokens"]
    assert "val_top1_accuracy" not in s


def test_from_generations_written_by_align(assets, tmp_path):
    """The file `train align` writes (read_generations format) builds a table over the tokenizer's vocabulary."""
    from draftverify.train.align import read_generations

    path = tmp_path / "gen.jsonl"
    write_generations(path, [([3, 4], [5, 6, 7]), ([5], [6, 7, 8])], 300)
    header, records = read_generations(path)
    assert header["vocab_size"] == 300 and len(records) == 2
    s = ng.build(opts(assets, tmp_path / "g.safetensors", from_generations=str(path)), log=lambda m: None)
    assert "val_top1_accuracy" in s  # evaluated on the corpus validation split
    t = NgramTable.load(tmp_path / "g.safetensors")
    assert as_dicts(t)[(6,)] == {7: 2} and as_dicts(t)[(5,)] == {6: 2}  # (5,) -> 6 crosses prompt | continuation
    assert (7,) not in as_dicts(t)  # seen once: pruned at the default min-count 2; backoff handles it


# ---------------------------------------------------------------- CLI


def test_cli_ngram(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    out = tmp_path / "zoo" / "ngram.safetensors"
    r = CliRunner().invoke(
        train_app,
        [
            "ngram",
            "--tokenizer",
            str(assets / "tok"),
            "--manifest",
            str(assets / "manifest.json"),
            "--out",
            str(out),
            "--order",
            "3",
            "--min-count",
            "2",
            "--top-k",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    assert out.is_file()
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["bytes"] == out.stat().st_size and summary["contexts"] > 0
    assert 0 < summary["val_top1_accuracy"] <= 1
    assert "MB" in r.output and "accuracy" in r.output
    table = NgramTable.load(out)
    assert all(len(t) <= 4 for ctx, (t, _) in table.tables.items() if ctx)

    for args, msg in [
        (["--manifest", str(tmp_path / "missing.json")], "manifest"),
        (["--tokenizer", str(tmp_path / "nope")], "tokenizer"),
        (["--order", "1"], "order"),
        (["--from-generations", str(tmp_path / "nope.jsonl")], "not found"),
    ]:
        base = [
            "ngram",
            "--tokenizer",
            str(assets / "tok"),
            "--manifest",
            str(assets / "manifest.json"),
            "--out",
            str(tmp_path / "x.safetensors"),
        ]
        r = CliRunner().invoke(train_app, base + args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and "Traceback" not in r.output


def test_table_drives_the_ngram_method(assets, tmp_path):
    """The built table loads in the ngram drafter and the loop stays lossless with it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftverify import SamplingParams, generate
    from draftverify.verifiers import GreedyVerifier

    ng.build(opts(assets, tmp_path / "t.safetensors"), log=lambda m: None)
    table = NgramTable.load(tmp_path / "t.safetensors")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=table.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    target = LlamaForCausalLM(cfg).double().eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    out = generate(target, NgramDrafter(table), GreedyVerifier(), ids, SamplingParams(), max_new_tokens=12)
    ref = target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.new_tokens[0].tolist() == ref[0, 4:].tolist()
