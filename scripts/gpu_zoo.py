"""The code zoo's GPU recipe: what trained the shipped target, draft and aligned draft on a lent GPU, in three steps.

    python scripts/gpu_zoo.py bundle runs/manifest-v2.json .gpu/corpus
    PYTHONPATH=src python scripts/gpu_zoo.py train --role target --minutes 7 --out /tmp/zoo/target
    PYTHONPATH=src python scripts/gpu_zoo.py align --target /tmp/zoo/target --draft /tmp/zoo/draft \
        --out /tmp/zoo/draft-aligned --minutes 2.5

bundle: a corpus manifest's files packed into two xz text files (train, val; documents separated by NUL): a lent
machine sees only the repository (64 MiB); the unpacked corpus is ~300 MB, its xz bundle a fraction.

train: the target or the draft on one GPU inside a fixed wall-clock budget. The CPU recipe (`draftverify train
lm`) checkpoints and resumes over hours; a lent GPU gives minutes and cannot keep state between calls, so this
trains from scratch within `--minutes` and exports once:
- data: the bundle, tokenized on the spot (documents joined with EOS);
- batches: random windows of seq_len + 1 tokens; held-out loss on 64 evenly spaced val windows of 512 tokens
  (the definition `draftverify train lm` uses) and on every non-overlapping val window;
- schedule: linear warm-up, cosine decay to 0.1x by elapsed *time* (the step count is unknown in advance);
- `--early-exit-layer L --early-exit-share s`: the last s of the budget fine-tunes with BiLD section 4.4's
  averaged loss (final layer + layer L through the shared norm and head; draftverify.train.losses, the loss
  `draftverify train early-exit` uses); the result is kept only when the full model's held-out loss is no worse
  than `--max-degradation` nats above its value before that phase.

align: BiLD prediction alignment of the draft, fine-tuned on the target's own greedy continuations. The CPU recipe
(`draftverify train align`) generates a few hundred continuations over hours; on a lent GPU the target writes
thousands in a minute. Prompts are random windows of the training split; the draft is trained on the target's
continuation tokens only (teacher forcing), then judged by greedy agreement on held-out prompts from the
validation split: the share of positions where the draft's argmax equals the target's greedy token, which is the
greedy acceptance rate alpha of speculative decoding. The early-exit view (first L target layers + the target's
norm and head) is measured on the same data.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from draftverify.train.losses import autocast, averaged_loss, held_out_losses, next_token_losses
from draftverify.train.presets import make_config
from draftverify.train.tokens import fixed_windows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu only for a smoke test


def bundle(argv: list[str]) -> None:
    """MANIFEST OUT: the manifest's train and val files as OUT/{train,val}.txt.xz."""
    from draftverify.train.corpus import iter_texts

    if len(argv) != 2:
        raise SystemExit("usage: gpu_zoo.py bundle MANIFEST OUT")
    manifest, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        with lzma.open(out / f"{split}.txt.xz", "wt", encoding="utf-8", preset=6) as f:
            for i, text in enumerate(iter_texts(manifest, split)):
                f.write(("\0" if i else "") + text)
        print(split, (out / f"{split}.txt.xz").stat().st_size / 1e6, "MB")


def load_tokens(bundle: Path, split: str, tokenizer: Tokenizer, eos: int) -> torch.Tensor:
    with lzma.open(bundle / f"{split}.txt.xz", "rt", encoding="utf-8") as f:
        docs = f.read().split("\0")
    ids: list[int] = []
    for enc in tokenizer.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(np.asarray(ids, dtype=np.int32))


def evaluate(
    model, windows: torch.Tensor, exit_layer: int | None = None, batch: int = 32
) -> tuple[float, float | None]:
    return held_out_losses(model, windows, True, batch, exit_layer, DEVICE)


def train(argv: list[str]) -> None:
    """The target or the draft from scratch within --minutes, exported once."""
    ap = argparse.ArgumentParser(prog="gpu_zoo.py train")
    ap.add_argument("--role", choices=["target", "draft"], required=True)
    ap.add_argument("--bundle", type=Path, default=Path(".gpu/corpus"))
    ap.add_argument("--tokenizer", type=Path, default=Path("zoo/code/tokenizer"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--early-exit-layer", type=int, default=None)
    ap.add_argument("--early-exit-share", type=float, default=0.2)
    ap.add_argument("--max-degradation", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument(
        "--finish-by",
        type=float,
        default=None,
        help="Unix time by which the export must be done (the budget shrinks to fit; 60 s kept for export).",
    )
    args = ap.parse_args(argv)

    t_start = time.time()
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    train = load_tokens(args.bundle, "train", tok, eos).to(DEVICE)
    val = load_tokens(args.bundle, "val", tok, eos)
    val64 = fixed_windows(val, 64, 512)
    val_all = val[: (len(val) - 1) // 513 * 513 + 1]
    val_all = torch.stack([val_all[i : i + 513] for i in range(0, len(val_all) - 513, 513)]).long()
    print(f"tokens: train {len(train):,} val {len(val):,} ({time.time() - t_start:.0f}s)", flush=True)

    config = make_config(args.role, vocab_size=tok.get_vocab_size(), eos_id=eos)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config).to(DEVICE)
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=DEVICE == "cuda")
    budget = args.minutes * 60.0
    if args.finish_by is not None:
        budget = min(budget, args.finish_by - time.time() - 60.0)
        print(f"training budget {budget / 60:.2f} min", flush=True)
    ee_from = budget * (1.0 - args.early_exit_share) if args.early_exit_layer else math.inf
    log: list[dict] = []
    step, tokens_seen, t0 = 0, 0, time.time()
    plain_state, plain_val = None, None
    while (elapsed := time.time() - t0) < budget:
        joint = elapsed >= ee_from
        if joint and plain_state is None:  # snapshot the plain model before BiLD's averaged-loss phase
            plain_val = evaluate(model, val64, args.early_exit_layer)
            plain_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            print(f"before early-exit phase: val {plain_val[0]:.4f} early {plain_val[1]:.4f}", flush=True)
        frac = elapsed / budget
        lr_scale = min(1.0, (step + 1) / args.warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = args.lr * lr_scale
        starts = torch.randint(0, len(train) - args.seq_len - 1, (args.batch,), device=DEVICE)
        x = train[starts[:, None] + torch.arange(args.seq_len + 1, device=DEVICE)[None]].long()  # [B, T+1]
        with autocast(True, DEVICE):
            final, early = next_token_losses(model, x, args.early_exit_layer if joint else None)
        loss = final if early is None else averaged_loss(final, early)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += args.batch * args.seq_len
        if step % args.eval_every == 0:
            v = evaluate(model, val64, args.early_exit_layer)
            entry = {
                "step": step,
                "minutes": (time.time() - t0) / 60,
                "tokens": tokens_seen,
                "train_loss": final.item(),
                "val_loss": v[0],
                "val_loss_early_exit": v[1],
                "joint": joint,
            }
            log.append(entry)
            print(json.dumps(entry), flush=True)
    train_minutes = (time.time() - t0) / 60
    final_val = evaluate(model, val64, args.early_exit_layer)
    kept_joint = None
    if plain_state is not None:
        kept_joint = final_val[0] <= plain_val[0] + args.max_degradation
        if not kept_joint:
            model.load_state_dict(plain_state)
            final_val = plain_val
    val_all_loss = evaluate(model, val_all)[0]
    report = {
        "role": args.role,
        "parameters": n_params,
        "config": config.to_dict(),
        "steps": step,
        "tokens_seen": tokens_seen,
        "train_tokens": len(train),
        "val_tokens": len(val),
        "epochs": tokens_seen / len(train),
        "train_minutes": train_minutes,
        "total_minutes": (time.time() - t_start) / 60,
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "val_loss_64x512": final_val[0],
        "val_loss_early_exit_64x512": final_val[1],
        "val_loss_all_windows": val_all_loss,
        "val_windows_all": len(val_all),
        "early_exit_layer": args.early_exit_layer,
        "early_exit_share": args.early_exit_share if args.early_exit_layer else None,
        "before_early_exit_phase": plain_val,
        "early_exit_kept": kept_joint,
        "max_degradation": args.max_degradation,
        "log": log,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.to(torch.float16).save_pretrained(args.out, max_shard_size="15MB")
    for f in args.tokenizer.iterdir():
        if f.name != "training_info.json":
            shutil.copy(f, args.out / f.name)
    (args.out / "training_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("log", "config")}), flush=True)


def windows(bundle: Path, split: str, tok: Tokenizer, eos: int, n: int, length: int, seed: int) -> torch.Tensor:
    data = load_tokens(bundle, split, tok, eos).long()  # the bundle tokenized as the train step does
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - length, (n,), generator=g)
    return data[starts[:, None] + torch.arange(length)[None]]  # [n, length]


@torch.no_grad()
def continuations(target, prompts: torch.Tensor, new: int, batch: int) -> torch.Tensor:
    """Target greedy continuations: [n, P] -> [n, P + new]."""
    out = []
    for i in range(0, len(prompts), batch):
        p = prompts[i : i + batch].to(DEVICE)
        seq = target.generate(
            p,
            attention_mask=torch.ones_like(p),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
        out.append(seq.cpu())
    return torch.cat(out)


@torch.no_grad()
def agreement(model, seqs: torch.Tensor, prompt_len: int, layers: int | None = None, batch: int = 64) -> float:
    """Share of continuation positions where model's argmax equals the target's greedy token."""
    hits, total = 0, 0
    for i in range(0, len(seqs), batch):
        x = seqs[i : i + batch].to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            if layers is None:
                logits = model(input_ids=x[:, :-1]).logits
            else:
                h = model(input_ids=x[:, :-1], output_hidden_states=True).hidden_states[layers]
                logits = model.lm_head(model.model.norm(h))
        pred = logits[:, prompt_len - 1 :].argmax(-1)  # predictions of the continuation tokens
        hits += (pred == x[:, prompt_len:]).sum().item()
        total += pred.numel()
    return hits / total


def align(argv: list[str]) -> None:
    """BiLD prediction alignment of the draft on the target's greedy continuations."""
    ap = argparse.ArgumentParser(prog="gpu_zoo.py align")
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bundle", type=Path, default=Path(".gpu/corpus"))
    ap.add_argument("--num-prompts", type=int, default=8192)
    ap.add_argument("--val-prompts", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=2.5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--early-exit-layers", type=int, default=2)
    args = ap.parse_args(argv)
    t_start = time.time()
    torch.manual_seed(0)
    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).to(DEVICE).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).to(DEVICE)
    train_prompts = windows(args.bundle, "train", tok, eos, args.num_prompts, args.prompt_len, seed=1)
    val_prompts = windows(args.bundle, "val", tok, eos, args.val_prompts, args.prompt_len, seed=2)
    t_gen = time.time()
    train_seqs = continuations(target, train_prompts, args.new_tokens, batch=512)
    val_seqs = continuations(target, val_prompts, args.new_tokens, batch=512)
    gen_minutes = (time.time() - t_gen) / 60
    before = agreement(draft, val_seqs, args.prompt_len)
    early = agreement(target, val_seqs, args.prompt_len, layers=args.early_exit_layers)
    print(
        f"generated {len(train_seqs)} + {len(val_seqs)} continuations in {gen_minutes:.1f} min; "
        f"draft agreement {before:.4f}, early exit L={args.early_exit_layers} {early:.4f}",
        flush=True,
    )

    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=DEVICE == "cuda")
    draft.train()
    step, t0, g = 0, time.time(), torch.Generator().manual_seed(3)
    while time.time() - t0 < args.minutes * 60:
        idx = torch.randint(0, len(train_seqs), (args.batch,), generator=g)
        x = train_seqs[idx].to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = draft(input_ids=x[:, :-1]).logits[:, args.prompt_len - 1 :]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, args.prompt_len :].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
    draft.eval()
    after = agreement(draft, val_seqs, args.prompt_len)
    report = {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "num_prompts": len(train_seqs),
        "val_prompts": len(val_seqs),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "generation_minutes": gen_minutes,
        "steps": step,
        "batch": args.batch,
        "lr": args.lr,
        "train_minutes": args.minutes,
        "total_minutes": (time.time() - t_start) / 60,
        "greedy_agreement_before": before,
        "greedy_agreement_after": after,
        "early_exit_layers": args.early_exit_layers,
        "early_exit_greedy_agreement": early,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(args.out)
    for f in args.draft.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (args.out / f.name).write_bytes(f.read_bytes())
    (args.out / "alignment_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)


STEPS = {"bundle": bundle, "train": train, "align": align}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in STEPS:
        raise SystemExit(f"usage: gpu_zoo.py {{{','.join(STEPS)}}} ...")
    STEPS[sys.argv[1]](sys.argv[2:])
