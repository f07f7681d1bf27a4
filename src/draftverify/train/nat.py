"""`draftverify train nat`: SpecDec's NAT drafter (drafters/nat.py) for a trained translation target.

SpecDec section 3.1: from a sentence y = (y_1..y_m) and a random cut p (0 <= p < m) the drafter learns to predict
y_{p+1..p+k} in parallel from the source and y_<=p, with the glancing strategy (GLAT, Qian et al. 2021: a first
pass predicts every slot; lambda x (its mistakes) random slots are then revealed with the reference token and the
loss is taken on the others, lambda annealed from 0.5 to 0.3), on sequence-level distilled targets: the target's
own greedy translations (`train distill`), which are exactly what vanilla SpecDec's verifier accepts.

The target is frozen: its encoder states (bf16 autocast, no gradients) are the drafter's memory, its embedding
matrix and output layer the drafter's input and output. k is drawn per batch from 1..block_size, so one drafter
serves the block-size sweep (`--gamma`); held-out figures use k = block_size.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..bench.environment import command_line, cpu_model
from .runner import Run, load_checkpoint
from .settings import RunOptions, TrainError, seed_everything, set_threads

GLANCE_START, GLANCE_END = 0.5, 0.3


@dataclass(kw_only=True)
class NatRunOptions(RunOptions):
    """The run settings both NAT recipes default alike (this one on a translation target, nat_lm.py's on a
    decoder-only one); each sets its own warm-up."""

    lr: float = 1e-3
    beta2: float = 0.98
    weight_decay: float = 0.01
    eval_minutes: Optional[float] = 5.0


@dataclass
class NatOptions(NatRunOptions):
    target: str
    out_dir: str
    train_targets: str  # distilled train targets, one a line (`train distill`)
    export_dir: str = "zoo/translate/nat"
    data: str = "../shared/data/multi30k_en_de"
    val_targets: Optional[str] = None  # distilled val targets (default: the val references)
    src_lang: str = "en"
    tgt_lang: str = "de"
    block_size: int = 8
    layers: int = 2
    max_tokens: int = 2048
    max_len: int = 128
    glancing: bool = True
    _: KW_ONLY
    warmup_steps: int = 200

    def validate(self) -> None:
        for name in ("block_size", "layers", "max_tokens", "max_len"):
            if getattr(self, name) <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive")
        self.validate_run()
        if not (Path(self.target) / "config.json").is_file():
            raise TrainError(f"--target {self.target}: no config.json there (expected an exported translation model)")
        for name in ("train_targets", "val_targets"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise TrainError(
                    f"--{name.replace('_', '-')} {path} not found; write it with `draftverify train distill`"
                )


def nat_batch(labels, k: int, rng: np.random.Generator, start_id: int, cuts=None):
    """Decoder inputs of one NAT step per row (SpecDec 3.1): the start token, a random prefix y_<=p of the row's
    target, then k - 1 masks; position p + i - 1 predicts y_{p+i} (i = 1..k). labels [B, T] (eos-terminated, -100
    padded). Returns tokens [B, W], slots [B, W] bool (the masks), padding [B, W] bool and targets [B, W]: the token
    each position predicts, -100 outside the block and past the target's end."""
    import torch

    lengths = (labels >= 0).sum(dim=1).tolist()
    cuts = [int(rng.integers(m)) for m in lengths] if cuts is None else cuts
    W = max(cuts) + k
    B = labels.shape[0]
    tokens = torch.full((B, W), start_id, dtype=torch.long)
    slots = torch.zeros((B, W), dtype=torch.bool)
    padding = torch.ones((B, W), dtype=torch.bool)
    targets = torch.full((B, W), -100, dtype=torch.long)
    for b, (p, m) in enumerate(zip(cuts, lengths)):
        tokens[b, 1 : p + 1] = labels[b, :p]
        slots[b, p + 1 : p + k] = True
        padding[b, : p + k] = False
        n = min(k, m - p)
        targets[b, p : p + n] = labels[b, p : p + n]
    return tokens, slots, padding, targets


def glance_ratio(glancing: bool, progress: float) -> float:
    """GLAT's glancing ratio at `progress` (0..1) of the run: annealed from GLANCE_START to GLANCE_END; 0 without
    glancing."""
    return GLANCE_START + (GLANCE_END - GLANCE_START) * progress if glancing else 0.0


def glance(tokens, slots, targets, predictions, ratio: float, rng: np.random.Generator):
    """GLAT's glancing: reveal round(ratio x wrong) random masks of each row whose token is known (the reference
    replaces [MASK]; the position before it, which predicts that token, leaves the loss)."""
    tokens, slots, targets = tokens.clone(), slots.clone(), targets.clone()
    valid = targets >= 0
    wrong = ((predictions != targets) & valid).sum(dim=1).tolist()
    revealable = valid.clone()
    revealable[:, :-1] &= slots[:, 1:]
    revealable[:, -1] = False
    for b, w in enumerate(wrong):
        cols = revealable[b].nonzero().flatten().tolist()
        n = min(int(round(ratio * w)), len(cols))
        for t in rng.choice(cols, size=n, replace=False) if n else ():
            tokens[b, t + 1] = targets[b, t]
            slots[b, t + 1] = False
            targets[b, t] = -100
    return tokens, slots, targets


def nat_loss(
    nat, target, batch: dict, k: int, rng: np.random.Generator, glance_ratio: float, bf16: bool, memory=None, cuts=None
):
    """Mean cross-entropy over the unrevealed labelled slots (glance_ratio 0: plain SpecDec objective)."""
    import torch

    from .losses import autocast

    start_id = target.config.decoder_start_token_id
    if memory is None:
        with torch.no_grad(), autocast(bf16):
            memory = target.get_encoder()(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state.float()
    tokens, slots, padding, labels = nat_batch(batch["labels"], k, rng, start_id, cuts)
    run = lambda t, s: nat(target, t, s, memory, batch["attention_mask"], padding)  # noqa: E731
    return glancing_loss(run, tokens, slots, labels, rng, glance_ratio, bf16)


def glancing_loss(run, tokens, slots, labels, rng: np.random.Generator, glance_ratio: float, bf16: bool):
    """The NAT drafters' training objective, whatever feeds them: run(tokens, slots) -> logits; with glance_ratio
    > 0 a no-grad pass first predicts every slot and glance() reveals some of the wrong ones; then the mean
    cross-entropy over the labelled slots left (labels -100 leave the loss)."""
    import torch
    import torch.nn.functional as F

    from .losses import autocast

    if glance_ratio > 0:
        with torch.no_grad(), autocast(bf16):
            predictions = run(tokens, slots).argmax(dim=-1)
        tokens, slots, labels = glance(tokens, slots, labels, predictions, glance_ratio, rng)
    with autocast(bf16):
        logits = run(tokens, slots)
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


def held_out(nat, target, pairs, batches, k: int, pad_id: int, bf16: bool) -> dict:
    """Slot cross-entropy and the mean accepted length of a k-block at fixed random cuts (greedy verification
    accepts the leading slots that equal the reference; on distilled references, the target's own outputs, that is
    what vanilla SpecDec accepts at that prefix)."""
    import torch
    import torch.nn.functional as F

    from .losses import autocast
    from .translation_data import collate

    rng = np.random.default_rng(0)
    was = nat.training
    nat.eval()
    ce = n_tok = accepted = n_blocks = 0.0
    with torch.no_grad():
        for idx in batches:
            b = collate(pairs, idx, pad_id)
            with autocast(bf16):
                memory = target.get_encoder()(
                    input_ids=b["input_ids"], attention_mask=b["attention_mask"]
                ).last_hidden_state
            tokens, slots, padding, labels = nat_batch(b["labels"], k, rng, target.config.decoder_start_token_id)
            with autocast(bf16):
                logits = nat(target, tokens, slots, memory.float(), b["attention_mask"], padding).float()
            valid = labels >= 0
            ce += F.cross_entropy(logits[valid], labels[valid], reduction="sum").item()
            n_tok += int(valid.sum())
            hit = logits.argmax(dim=-1) == labels  # [B, W]
            for row_hit, row_valid in zip(hit, valid):
                accepted += int(row_hit[row_valid].int().cumprod(dim=0).sum())
                n_blocks += 1
    nat.train(was)
    return {"slot_loss": ce / max(n_tok, 1), "accepted_per_block": accepted / max(n_blocks, 1)}


def banner(nat, n_params: int, opts, target: str, data: str, last: str, shape: str = "") -> str:
    """The line a NAT training run starts with (opts: either recipe's options): the drafter's size and shape (shape:
    more of it, e.g. its window), the frozen target (target: what kind), the blocks, the data, whether it glances,
    and a last part of its own."""
    return (
        f"NAT drafter: {n_params:,} params ({opts.layers} layers, d {nat.config.hidden_size}{shape}) on the frozen "
        f"{target} {opts.target} | k in 1..{opts.block_size} | {data} | glancing {'on' if opts.glancing else 'off'} "
        f"| {last}"
    )


def slot_figures(run: Run, figures: dict, k: int, log: Callable[[str], None], digits: int) -> float:
    """An evaluation's held-out figures (held_out's, or nat_lm's): the mean accepted slots kept in the run's state
    for the card, one log line, and the slot loss returned (the run's metric)."""
    run.state["accepted_per_block"] = figures["accepted_per_block"]
    log(
        f"eval at step {run.state['step']}: slot loss {figures['slot_loss']:.4f} | mean accepted "
        f"{figures['accepted_per_block']:.{digits}f} of k={k} slots (teacher-forced, val)"
    )
    return figures["slot_loss"]


def train(opts: NatOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None) -> dict:
    opts.validate()
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from ..drafters.nat import NatDecoder
    from .presets import count_params
    from .tokenizer import load_tokenizer
    from .translation_data import (
        DATA_TERMS,
        Pairs,
        collate,
        encode,
        read_pairs,
        read_targets,
        token_batches,
        with_targets,
    )

    set_threads(opts.threads)
    out_dir = Path(opts.out_dir)
    tok = load_tokenizer(opts.target)
    pad = tok.eos_token_id
    target = AutoModelForSeq2SeqLM.from_pretrained(opts.target, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    src, tgt = with_targets(read_pairs(opts.data, "train", opts.src_lang, opts.tgt_lang)[0], opts.train_targets, log)
    train_pairs = Pairs(encode(tok, src, opts.max_len), encode(tok, tgt, opts.max_len))
    vsrc, vref = read_pairs(opts.data, "val", opts.src_lang, opts.tgt_lang)
    vtgt = read_targets(opts.val_targets, len(vsrc)) if opts.val_targets else vref
    val_pairs = Pairs(encode(tok, vsrc, opts.max_len), encode(tok, vtgt, opts.max_len))
    batches = token_batches(train_pairs, opts.max_tokens)
    val_batches = token_batches(val_pairs, opts.max_tokens)

    seed_everything(opts.seed)
    ckpt = load_checkpoint(out_dir)
    nat = NatDecoder.for_target(target, layers=opts.layers, block_size=opts.block_size)
    n_params = count_params(nat)
    run: Run

    def loss(model, batch):
        k = int(run.rng.integers(1, opts.block_size + 1))
        return nat_loss(model, target, batch, k, run.rng, glance_ratio(opts.glancing, run.progress()), run.bf16)

    def evaluate(model) -> float:
        figures = held_out(model, target, val_pairs, val_batches, opts.block_size, pad, run.bf16)
        return slot_figures(run, figures, opts.block_size, log, digits=2)

    run = Run(
        nat,
        opts,
        out_dir,
        batches=lambda rng: collate(train_pairs, batches[int(rng.integers(len(batches)))], pad),
        loss=loss,
        evaluate=evaluate,
        metric="slot_loss",
        counts=lambda b: {"sentences_seen": int(b["labels"].shape[0])},
        state={"sentences_seen": 0, "accepted_per_block": None},
        checkpoint=ckpt,
        log=log,
    )
    del ckpt
    log(banner(nat, n_params, opts, "target", f"{len(train_pairs):,} pairs", "bf16 autocast" if run.bf16 else "fp32"))
    state = run.fit(stop_after_steps)
    if state["stopped"]:
        return {"step": state["step"], "stopped": True, "params": n_params}
    report = {
        "params": n_params,
        "target": opts.target,
        "train_targets": opts.train_targets,
        "val_targets": opts.val_targets,
        "train_pairs": len(train_pairs),
        "data_terms": DATA_TERMS,
        "block_size": opts.block_size,
        "layers": opts.layers,
        "glancing": [GLANCE_START, GLANCE_END] if opts.glancing else None,
        "step": state["step"],
        "epochs": state["sentences_seen"] / max(len(train_pairs), 1),
        "elapsed": state["elapsed"],
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "slot_loss": state["slot_loss"],
        "accepted_per_block": state["accepted_per_block"],
        "lr": opts.lr,
        "max_tokens": opts.max_tokens,
        "resumes": state["resumes"],
        "command": "\n".join(state["commands"]) if state["resumes"] else (opts.command or command_line()),
    }
    nat.save(opts.export_dir, {"training": report})
    log(f"saved the NAT drafter to {opts.export_dir}")
    return report


def distill(
    model_dir: str,
    data: str,
    split: str,
    out: str,
    src_lang: str = "en",
    tgt_lang: str = "de",
    chunk: int = 512,
    log: Callable[[str], None] = print,
) -> int:
    """Greedy translations of a split by `model_dir` (HF generate, fp32), one a line; resumable: lines already
    in `out` are kept and the rest appended chunk by chunk. Returns the number of lines written in total."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from .seq2seq import translate
    from .tokenizer import load_tokenizer
    from .translation_data import read_lines

    src = read_lines(data, split, src_lang)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = path.read_text(encoding="utf-8").count("\n") if path.exists() else 0
    if done >= len(src):
        return done
    tok = load_tokenizer(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for i in range(done, len(src), chunk):
        hyp = translate(model, tok, src[i : i + chunk])
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(h.replace("\n", " ") + "\n" for h in hyp))
        log(f"distill {split}: {min(i + chunk, len(src))}/{len(src)} sentences")
    return len(src)
