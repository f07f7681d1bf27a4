"""`draftverify train seq2seq`: a small Transformer translation model (``MarianMTModel``) on Multi30k.

The recipe on top of the shared run (train/runner.py, on transformers' Trainer: schedule, budgets, checkpoints, resume):

* data: sentence pairs of train/translation_data.py, batched by tokens, one joint byte-level BPE tokenizer whose
  ``<|endoftext|>`` is eos, pad and the decoder start token;
* model: a preset below (Vaswani-style post-LN encoder-decoder with sinusoidal positions and one shared embedding
  matrix for encoder, decoder and output), so ``AutoModelForSeq2SeqLM`` and HF ``generate`` run the export;
* objective: label-smoothed cross-entropy (Szegedy et al.; 0.1 as in the Transformer paper);
* held-out figures: the val cross-entropy (the run's metric), and sacrebleu BLEU / chrF of greedy
  translations of the first ``bleu_sentences`` val sources at every evaluation;
* at the end: fp16 export with the tokenizer, BLEU / chrF on the full val and test sets (greedy, as the card says),
  and ``training_report.json``, from which the model card is written (seq2seq_card.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import KW_ONLY
from pathlib import Path
from typing import Callable, Optional

from ..bench.environment import command_line, cpu_model
from ..options.declare import option
from .presets import count_params, preset_config, preset_table
from .runner import Run, load_checkpoint
from .settings import RunOptions, TrainError, seed_everything, set_threads
from .shared_flags import recipe_options, shared

# Architectures (vocab_size, token ids filled in from the tokenizer), one row a preset in PRESET_FIELDS' order.
# Sized for one CPU thread: see the card.
PRESET_FIELDS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)
PRESETS = preset_table(
    PRESET_FIELDS,
    {
        # the target: Transformer-base shape scaled down (d 256, 3+3 layers, 4 heads, FFN 1024)
        "target": (256, 3, 3, 4, 4, 1024, 1024),
        # BiLD's small autoregressive model: one decoder layer, narrower
        "small": (192, 2, 1, 4, 4, 768, 768),
        # for tests only
        "tiny": (32, 1, 1, 2, 2, 64, 64),
    },
)
MAX_POSITIONS = 512


def make_config(preset: str, vocab_size: int, eos_id: int, dropout: float = 0.1):
    """A MarianConfig for `preset` whose eos = pad = decoder start = the tokenizer's eos."""
    from transformers import MarianConfig

    fields = preset_config(PRESETS, preset)
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        activation_function="relu",
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=eos_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        decoder_start_token_id=eos_id,
        forced_eos_token_id=None,
        **fields,
    )


@recipe_options
class Seq2SeqOptions(RunOptions):
    """`train seq2seq`'s options, each its flag (the run options' too: RunOptions)."""

    out_dir: str = shared(...)
    tokenizer: str = shared("zoo/translate/tokenizer", "Joint tokenizer directory.")
    data: str = shared("../shared/data/multi30k_en_de")
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    preset: str = shared("target", "Architecture: target | small (| tiny).")
    export_dir: Optional[str] = shared(None)  # default: out_dir/export
    max_tokens: int = shared(2048)  # padded tokens per batch (the longer side)
    max_len: int = 128  # tokens per sentence (longer ones are cut)
    label_smoothing: float = option(0.1, "--label-smoothing", "Label smoothing of the cross-entropy loss.")
    dropout: float = option(0.1, "--dropout", "Dropout of the model.")
    bleu_sentences: int = option(200, "--bleu-sentences", "Val sources translated at each evaluation.")
    train_targets: Optional[str] = shared(None)  # a file of target-side sentences replacing the train targets
    init_from: Optional[str] = shared(None, "Continue from an exported model (fresh optimizer), e.g. BiLD alignment.")
    export: bool = True
    _: KW_ONLY
    lr: float = shared(1e-3)
    warmup_steps: int = shared(400)
    min_lr_ratio: float = shared(0.05)
    beta2: float = 0.98
    weight_decay: float = shared(0.01)
    eval_minutes: Optional[float] = shared(10.0, "Val loss / BLEU / chrF interval (minutes).")
    checkpoint_minutes: float = shared(5.0)
    log_every: int = shared(20)

    def validate(self) -> None:
        if self.preset not in PRESETS:
            raise TrainError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        for name in ("max_tokens", "max_len", "bleu_sentences"):
            if getattr(self, name) <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive")
        if not 0 <= self.label_smoothing < 1:
            raise TrainError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0 <= self.dropout < 1:
            raise TrainError(f"--dropout must be in [0, 1), got {self.dropout}")
        self.validate_run()
        if self.init_from is not None and not (Path(self.init_from) / "config.json").is_file():
            raise TrainError(f"--init-from {self.init_from}: no config.json there (expected an exported model)")
        if not (Path(self.tokenizer) / "tokenizer.json").is_file():
            raise TrainError(
                f"--tokenizer {self.tokenizer}: no tokenizer.json there; create it with "
                f"`draftverify train translate-tokenizer --out {self.tokenizer}`"
            )


def shift_right(labels, start_id: int):
    """Decoder inputs [B, T] of labels [B, T]: the start token, then the labels but the last (-100 -> start_id)."""
    import torch

    dec = torch.full_like(labels, start_id)
    dec[:, 1:] = labels[:, :-1].clamp_min(0).masked_fill(labels[:, :-1] < 0, start_id)
    return dec


def seq2seq_loss(model, batch, label_smoothing: float, bf16: bool):
    """Mean label-smoothed cross-entropy per target token (padding ignored)."""
    import torch.nn.functional as F

    from .losses import autocast

    with autocast(bf16):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=shift_right(batch["labels"], model.config.decoder_start_token_id),
            use_cache=False,
        )
    logits = out.logits.float()
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        batch["labels"].reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


def held_out_loss(model, pairs, batches, pad_id: int, bf16: bool) -> float:
    """Plain cross-entropy per target token over every held-out pair (eval mode, no gradients)."""
    import torch

    from .translation_data import collate

    was = model.training
    model.eval()
    tot = n = 0.0
    with torch.no_grad():
        for idx in batches:
            b = collate(pairs, idx, pad_id)
            k = int((b["labels"] >= 0).sum())
            tot += seq2seq_loss(model, b, 0.0, bf16).item() * k
            n += k
    model.train(was)
    return tot / max(n, 1)


def translate(
    model, tok, sources: list[str], num_beams: int = 1, batch_size: int = 64, max_len: int = 128, bf16: bool = False
) -> list[str]:
    """HF generate (greedy, or beam search with num_beams > 1) over `sources`, longest first for tight batches."""
    import torch

    from .losses import autocast

    was = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    out: list[str] = [""] * len(sources)
    eos = tok.eos_token_id
    with torch.no_grad(), autocast(bf16):
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            ids = [tok(sources[j], add_special_tokens=False)["input_ids"][: max_len - 1] + [eos] for j in idx]
            S = max(map(len, ids))
            input_ids = torch.full((len(ids), S), eos, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for b, row in enumerate(ids):
                input_ids[b, : len(row)] = torch.tensor(row)
                mask[b, : len(row)] = 1
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                num_beams=num_beams,
                do_sample=False,
                max_new_tokens=max_len,
                early_stopping=True if num_beams > 1 else False,
            )
            for b, j in enumerate(idx):
                out[j] = tok.decode(gen[b, 1:], skip_special_tokens=True).strip()
    model.train(was)
    return out


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict:
    """sacrebleu corpus BLEU (13a tokenisation) and chrF, as its signature strings record."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def score_split(
    model, tok, data, split: str, src_lang: str, tgt_lang: str, num_beams: int = 1, limit: Optional[int] = None
) -> dict:
    """BLEU / chrF of the model's translations of one split against its references."""
    from .translation_data import read_pairs

    src, ref = read_pairs(data, split, src_lang, tgt_lang)
    if limit is not None:
        src, ref = src[:limit], ref[:limit]
    hyp = translate(model, tok, src, num_beams=num_beams)
    return {"split": split, "num_beams": num_beams, **bleu_chrf(hyp, ref)}


def _build_model(opts: Seq2SeqOptions, tok, ckpt: Optional[dict]):
    """The checkpoint's architecture when resuming, else --init-from's weights, else a fresh preset."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    if ckpt is None and opts.init_from:
        model = MarianMTModel.from_pretrained(opts.init_from, dtype=torch.float32)
        if model.config.vocab_size != len(tok):
            raise TrainError(f"--init-from model vocab {model.config.vocab_size} != tokenizer vocab {len(tok)}")
    else:
        config = (
            MarianConfig.from_dict(ckpt["config"])
            if ckpt is not None
            else make_config(opts.preset, len(tok), tok.eos_token_id, opts.dropout)
        )
        model = MarianMTModel(config)
    model.config._attn_implementation = "sdpa"
    return model


def train(opts: Seq2SeqOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None) -> dict:
    """Run (or resume) a training run; export and score it at the end. Returns the training report."""
    opts.validate()
    import torch
    from transformers import __version__ as tf_version

    from .export import export_model
    from .seq2seq_card import model_card
    from .tokenizer import load_tokenizer, tokenizer_hash
    from .translation_data import (
        DATA_TERMS,
        TEST_SPLIT,
        Pairs,
        collate,
        encode,
        read_pairs,
        token_batches,
        with_targets,
    )

    set_threads(opts.threads)
    out_dir = Path(opts.out_dir)
    export_dir = Path(opts.export_dir) if opts.export_dir else out_dir / "export"
    tok = load_tokenizer(opts.tokenizer)
    pad = tok.eos_token_id
    src, tgt = read_pairs(opts.data, "train", opts.src_lang, opts.tgt_lang)
    if opts.train_targets:
        src, tgt = with_targets(src, opts.train_targets, log)
    train_pairs = Pairs(encode(tok, src, opts.max_len), encode(tok, tgt, opts.max_len))
    vsrc, vtgt = read_pairs(opts.data, "val", opts.src_lang, opts.tgt_lang)
    val_pairs = Pairs(encode(tok, vsrc, opts.max_len), encode(tok, vtgt, opts.max_len))
    batches = token_batches(train_pairs, opts.max_tokens)
    val_batches = token_batches(val_pairs, opts.max_tokens)

    seed_everything(opts.seed)
    ckpt = load_checkpoint(out_dir)
    model = _build_model(opts, tok, ckpt)
    n_params = count_params(model)
    run: Run

    def evaluate(m) -> float:
        loss = held_out_loss(m, val_pairs, val_batches, pad, run.bf16)
        hyp = translate(m, tok, vsrc[: opts.bleu_sentences], bf16=run.bf16)
        scores = bleu_chrf(hyp, vtgt[: opts.bleu_sentences])
        run.state["val_bleu"], run.state["val_chrf"] = scores["bleu"], scores["chrf"]
        log(
            f"eval at step {run.state['step']}: val loss {loss:.4f} | BLEU {scores['bleu']:.2f} | "
            f"chrF {scores['chrf']:.2f} (greedy, first {len(hyp)} val sentences)"
        )
        return loss

    run = Run(
        model,
        opts,
        out_dir,
        batches=lambda rng: collate(train_pairs, batches[int(rng.integers(len(batches)))], pad),
        loss=lambda m, b: seq2seq_loss(m, b, opts.label_smoothing, run.bf16),
        evaluate=evaluate,
        counts=lambda b: {"tokens_seen": int((b["labels"] >= 0).sum()), "sentences_seen": int(b["labels"].shape[0])},
        state={"tokens_seen": 0, "sentences_seen": 0, "val_bleu": None, "val_chrf": None, "preset": opts.preset},
        checkpoint=ckpt,
        log=log,
    )
    del ckpt
    log(
        f"model: MarianMTModel preset {opts.preset} | {n_params:,} params | {len(train_pairs):,} train pairs in "
        f"{len(batches):,} batches of <= {opts.max_tokens} tokens | lr {opts.lr} | "
        f"{'bf16 autocast' if run.bf16 else 'fp32'} | threads {torch.get_num_threads()}"
    )
    state = run.fit(stop_after_steps)
    if state["stopped"]:
        return {"step": state["step"], "stopped": True, "params": n_params, "out_dir": str(out_dir)}

    model.eval()
    scores = {
        split: score_split(model, tok, opts.data, split, opts.src_lang, opts.tgt_lang) for split in ("val", TEST_SPLIT)
    }
    for split, s in scores.items():
        log(f"{split}: BLEU {s['bleu']:.2f} | chrF {s['chrf']:.2f} (greedy, {s['sentences']} sentences)")
    report = {
        "architecture": "MarianMTModel",
        "preset": opts.preset,
        "params": n_params,
        "config": model.config.to_dict(),
        "data": os.path.relpath(opts.data),
        "data_terms": DATA_TERMS,
        "languages": [opts.src_lang, opts.tgt_lang],
        "train_pairs": len(train_pairs),
        "train_targets": opts.train_targets,
        "init_from": opts.init_from,
        "train_target_tokens": int(sum(len(t) for t in train_pairs.tgt)),
        "tokenizer_hash": tokenizer_hash(opts.tokenizer),
        "vocab_size": len(tok),
        "command": "\n".join(state["commands"]) if state["resumes"] else (opts.command or command_line()),
        "max_tokens": opts.max_tokens,
        "lr": opts.lr,
        "betas": (opts.beta1, opts.beta2),
        "weight_decay": opts.weight_decay,
        "warmup_steps": opts.warmup_steps,
        "min_lr_ratio": opts.min_lr_ratio,
        "label_smoothing": opts.label_smoothing,
        "dropout": opts.dropout,
        "grad_clip": opts.grad_clip,
        "seed": opts.seed,
        "step": state["step"],
        "tokens_seen": state["tokens_seen"],
        "sentences_seen": state["sentences_seen"],
        "epochs": state["sentences_seen"] / max(len(train_pairs), 1),
        "elapsed": state["elapsed"],
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "resumes": state["resumes"],
        "val_loss": state["val_loss"],
        "bf16": run.bf16,
        "scores": scores,
        "torch": torch.__version__,
        "transformers": tf_version,
    }
    if opts.export:
        export_model(model, tok, export_dir, model_card(report))
        (export_dir / "training_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        report["export_dir"] = str(export_dir)
        log(f"exported fp16 model to {export_dir}")
    return report
