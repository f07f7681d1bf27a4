"""BiLD prediction alignment of the zoo's draft on a GPU: fine-tune it on the target's own greedy continuations.

The CPU recipe (`draftverify train align`) generates a few hundred continuations over hours; on a lent GPU the
target writes thousands in a minute. Prompts are random windows of the training split; the draft is trained on
the target's continuation tokens only (teacher forcing), then judged by greedy agreement on held-out prompts from
the validation split: the share of positions where the draft's argmax equals the target's greedy token, which
is the greedy acceptance rate alpha of speculative decoding. The early-exit view (first L target layers + the
target's norm and head) is measured on the same data.
Usage: PYTHONPATH=src python scripts/align_zoo_gpu.py --target /tmp/zoo/target --draft /tmp/zoo/draft \
           --out /tmp/zoo/draft-aligned --minutes 2.5
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from train_zoo_gpu import load_tokens  # scripts/ is on sys.path when a script in it runs
from transformers import AutoModelForCausalLM

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu only for a smoke test


def windows(bundle: Path, split: str, tok: Tokenizer, eos: int, n: int, length: int, seed: int) -> torch.Tensor:
    data = load_tokens(bundle, split, tok, eos).long()  # the bundle tokenized as train_zoo_gpu.py does
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - length, (n,), generator=g)
    return data[starts[:, None] + torch.arange(length)[None]]  # [n, length]


@torch.no_grad()
def continuations(target, prompts: torch.Tensor, new: int, batch: int) -> torch.Tensor:
    """Target greedy continuations: [n, P] -> [n, P + new]."""
    out = []
    for i in range(0, len(prompts), batch):
        p = prompts[i : i + batch].to(DEVICE)
        seq = target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)
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


def main() -> None:
    ap = argparse.ArgumentParser()
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
    args = ap.parse_args()
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
    print(f"generated {len(train_seqs)} + {len(val_seqs)} continuations in {gen_minutes:.1f} min; "
          f"draft agreement {before:.4f}, early exit L={args.early_exit_layers} {early:.4f}", flush=True)

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
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
        "num_prompts": len(train_seqs), "val_prompts": len(val_seqs), "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "generation_minutes": gen_minutes, "steps": step, "batch": args.batch,
        "lr": args.lr, "train_minutes": args.minutes, "total_minutes": (time.time() - t_start) / 60,
        "greedy_agreement_before": before, "greedy_agreement_after": after,
        "early_exit_layers": args.early_exit_layers, "early_exit_greedy_agreement": early,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(args.out)
    for f in args.draft.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (args.out / f.name).write_bytes(f.read_bytes())
    (args.out / "alignment_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
