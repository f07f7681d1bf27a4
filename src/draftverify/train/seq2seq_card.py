"""The model card (README.md) of a translation model trained by `draftverify train seq2seq` or `train nat`, written
from its training_report.json, so every figure on a card is one the training measured (never typed by hand)."""

from __future__ import annotations

from ..bench.folders import TRANSLATION
from ..markdown import command_block, markdown_table


def _scores_lines(report: dict) -> list[str]:
    scores = list(report.get("scores", {}).values())
    if not scores:
        return []
    cells = [
        (s["split"], "greedy" if s["num_beams"] == 1 else f"beam {s['num_beams']}", s["sentences"])
        + (f"{s['bleu']:.2f}", f"{s['chrf']:.2f}")
        for s in scores
    ]
    sig = scores[0]
    return [
        *markdown_table(("split", "decoding", "sentences", "BLEU", "chrF"), cells),
        "",
        f"sacrebleu signatures: `{sig['bleu_signature']}`, `{sig['chrf_signature']}`.",
    ]


def _alignment_lines(bench: dict) -> list[str]:
    """BiLD before / after (reproduce specdec's `aligned` figures): the fewest large-model calls per sentence."""
    fewest = bench["aligned"]["fewest_target_calls"]
    f2 = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    return [
        "## BiLD with this model (prediction alignment, before / after)",
        "",
        f"From `{bench['command']}` ({bench['sentences']} sentences of {bench['prompts']}; AT greedy BLEU "
        f"{bench['aligned']['greedy_bleu']:.2f}); the fewest large-model calls per sentence among the BiLD "
        "fallback / rollback settings:",
        "",
        *markdown_table(
            ("small model", "at no BLEU loss", "within 1 BLEU"),
            [
                (label, f2(fewest[family]["no_loss"]), f2(fewest[family]["within_1_bleu"]))
                for family, label in (("bild", "original (`draft`)"), ("bild_aligned", "aligned (this model)"))
            ],
        ),
        "",
        f"Every row: `{(TRANSLATION / bench['name']).as_posix()}.md`.",
        "",
    ]


def model_card(report: dict) -> str:
    cfg = report["config"]
    src, tgt = report["languages"]
    role = report.get("role", report["preset"])
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: translation",
        f"language: [{src}, {tgt}]",
        "tags: [draftverify, translation, marian, speculative-decoding, multi30k]",
        "---",
        "",
        f"# draftverify translate-{role} ({report['params'] / 1e6:.2f}M parameters, {src} -> {tgt})",
        "",
        f"A small `{report['architecture']}` trained from scratch by draftverify as the *{role}* model of the "
        "project's translation zoo (speculative decoding experiments: SpecDec, BiLD). It translates short image "
        "captions and is not meant for anything else.",
        "",
        "## Data and terms",
        "",
        f"- {report['data_terms']}",
        f"- Train split: {report['train_pairs']:,} caption pairs ({report['train_target_tokens']:,} target tokens); "
        + (
            "targets: the reference translations."
            if not report.get("train_targets")
            else f"targets: `{report['train_targets']}` (sequence-level distillation: the target model's translations)."
        ),
        *(
            [
                f"- Initialised from `{report['init_from']}` (BiLD prediction alignment when the targets are the large "
                "model's translations)."
            ]
            if report.get("init_from")
            else []
        ),
        f"- Tokenizer: joint byte-level BPE over both languages, vocab {report['vocab_size']} "
        f"(sha256 `{report['tokenizer_hash'][:16]}`), `<|endoftext|>` = eos = pad = decoder start.",
        "",
        "## Model",
        "",
        f"- Parameters: {report['params']:,}; d_model {cfg['d_model']}, encoder layers {cfg['encoder_layers']}, "
        f"decoder layers {cfg['decoder_layers']}, heads {cfg['encoder_attention_heads']}, FFN "
        f"{cfg['encoder_ffn_dim']}, one embedding matrix shared by encoder, decoder and output layer, sinusoidal "
        "positions.",
        "- Weights exported in float16 (safetensors); trained in "
        + ("bf16 autocast (fp32 master weights)" if report["bf16"] else "float32")
        + " on CPU.",
        "",
        *command_block("## Training", report["command"], language=""),
        "",
        f"- Batches of at most {report['max_tokens']:,} padded tokens, AdamW (betas {tuple(report['betas'])}, weight "
        f"decay {report['weight_decay']}), peak LR {report['lr']}, {report['warmup_steps']} warmup steps, cosine "
        f"decay to {report['min_lr_ratio']}x, label smoothing {report['label_smoothing']}, dropout "
        f"{report['dropout']}, grad clip {report['grad_clip']}, seed {report['seed']}.",
        f"- Steps: {report['step']:,}; {report['epochs']:.1f} epochs ({report['tokens_seen']:,} target tokens).",
        f"- Training time: {report['elapsed'] / 60:.1f} min on {report['threads']} CPU thread(s) ({report['cpu']}); "
        f"resumed {report['resumes']} time(s).",
        f"- Final val cross-entropy: {report['val_loss']:.4f} nats/token.",
        f"- Software: torch {report['torch']}, transformers {report['transformers']}.",
        "",
        "## Scores",
        "",
        *_scores_lines(report),
        "",
        "Measured at the end of training by the training command (HF `generate`, greedy); "
        "`python scripts/zoo_cards.py translate --rescore` measures them again.",
        "",
        *(_alignment_lines(report["bild_alignment"]) if (report.get("bild_alignment") or {}).get("aligned") else []),
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(path)",
        "model = AutoModelForSeq2SeqLM.from_pretrained(path)",
        'ids = tok("A man rides a bike.", return_tensors="pt").input_ids  # ends with eos, as in training',
        "print(tok.decode(model.generate(ids, max_new_tokens=64)[0], skip_special_tokens=True))",
        "```",
        "",
    ]
    return "\n".join(lines)


def nat_card(info: dict) -> str:
    """The card of a NAT drafter folder (nat.json: its config and `training`, the report of `train nat`)."""
    t = info["training"]
    lines = [
        f"# draftverify translate NAT drafter ({t['params'] / 1e6:.2f}M parameters)",
        "",
        "SpecDec's non-autoregressive drafter (Xia et al., section 3.1) for the zoo's translation target: given the "
        f"source and the accepted prefix it predicts up to k = {info['block_size']} tokens in one forward pass (the "
        "prefix then k - 1 mask slots, bidirectional attention over all of them). It reads the target's encoder "
        "states, embedding matrix and output layer (frozen, not stored here), so it only works with that target "
        f"(embedding fingerprint `{info['target_fingerprint']}`). Methods: `specdec` (greedy verification: exactly the "
        "target's greedy translation) and `specdec++_nat` (top-beta / tau).",
        "",
        "## Data and terms",
        "",
        f"- {t['data_terms']}",
        f"- Trained on {t['train_pairs']:,} train sources with the target's own greedy translations as targets "
        f"(`{t['train_targets']}`, sequence-level distillation by `draftverify train distill`).",
        "",
        "## Model and training",
        "",
        f"- {info['layers']} decoder layers, d_model {info['hidden_size']}, {info['heads']} heads, FFN "
        f"{info['ffn_size']}, learned positions (at most {info['max_positions']}), a learned [MASK] vector; post-LN "
        "layers started from the target's own decoder layers and positions (`NatDecoder.for_target`).",
        f"- Random prefix cut points, k drawn from 1..{info['block_size']} per batch, glancing "
        f"{'(ratio ' + ' -> '.join(map(str, t['glancing'])) + ')' if t['glancing'] else 'off'}.",
        "",
        "```",
        t["command"],
        "```",
        "",
        f"- Steps: {t['step']:,} ({t['epochs']:.1f} epochs), {t['elapsed'] / 60:.1f} min on {t['threads']} CPU "
        f"thread(s) ({t['cpu']}); batches of at most {t['max_tokens']} tokens, peak LR {t['lr']}.",
        f"- Held-out (val, teacher-forced at random cuts, k = {info['block_size']}): slot cross-entropy "
        f"{t['slot_loss']:.4f}, mean accepted slots per block {t['accepted_per_block']:.2f} "
        f"(against {t['val_targets'] or 'the references'}).",
        "",
    ]
    return "\n".join(lines)
