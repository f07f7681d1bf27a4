"""Blockwise parallel decoding heads (Stern et al. 2018) trained on a frozen target's own greedy outputs.

1. **Data.** Prompts are windows of the corpus (``align.sample_prompts``: train split for training, val split for
   the held-out accuracy); the target's greedy continuations are generated in batches of equal-length prompts
   (``batched_continuations``; HF ``generate``, no padding) and cached in a resumable JSONL. Training on what the
   target *will say*, not on the corpus, is what makes the heads' drafts acceptable; batching makes far more of it
   affordable on a CPU (batched float arithmetic may flip a rare near-tie, which training data can live with).
2. **Features.** One frozen target forward per prompt + continuation gives the last hidden state (after the final
   norm, the one the LM head reads) at every position whose next token is a continuation token. Position t's
   label for head i is token t + i (-100 past the end). Cached next to the generations, so training reruns cost
   no target forward.
3. **Train.** Only the heads' weights learn: loss = mean over heads 2..h of the cross-entropy of head i on token
   t + i (head 1 is the target itself), on the shared run (``train.runner``, on transformers' Trainer: AdamW +
   warmup/cosine, budgets, a resumable SIGINT-safe checkpoint in ``work_dir/run-h{h}``); held-out top-1 accuracy
   per head at the start and the end.
4. **Export.** ``BlockwiseHeads.save`` (fp16 safetensors + heads.json with the training facts) and a model card.
"""

from __future__ import annotations

import json
import time
from dataclasses import KW_ONLY
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from ..bench.environment import command_line
from ..markdown import markdown_table
from ..options.declare import option
from . import align, corpus as corpus_mod
from .frozen import GreedyFeaturesOptions, fit_facts, fit_measured, load_frozen_target, run_facts
from .lm import TrainError
from .runner import Run
from .settings import seed_everything
from .shared_flags import recipe_options, shared
from .tokenizer import tokenizer_hash

if TYPE_CHECKING:  # torch is imported where it is used: the module loads without it
    import torch

IGNORE = -100
FEATURES_VERSION = 1


@recipe_options
class HeadsOptions(GreedyFeaturesOptions):
    """`train heads`' options, each its flag (the run options' too: RunOptions)."""

    out_dir: str = shared("zoo/code/heads", "Where to save the heads (safetensors + JSON).")
    work_dir: str = shared("runs/heads")  # generations, features, checkpoint
    num_heads: int = option(4, "--num-heads", "h, counting head 1 (the target itself); 2..9.")
    ffn_size: Optional[int] = option(None, "--ffn-size", "Hidden layer of each head (default: hidden size).")
    _: KW_ONLY
    batch_size: int = shared(512, "Positions per step.")
    lr: float = shared(2e-3)
    checkpoint_minutes: float = shared(2.0)
    log_every: int = shared(50)

    def validate(self) -> None:
        self.validate_frozen(("num_prompts", "eval_prompts", "new_tokens", "generate_batch"))
        if not 2 <= self.num_heads <= 9:
            raise TrainError(f"--num-heads must be in 2..9 (head 1 is the target itself), got {self.num_heads}")


# --------------------------------------------------------------------------- data


def batched_continuations(
    path: Path,
    header: dict,
    prompts: list[dict],
    target,
    new_tokens: int,
    eos_id: int,
    batch: int,
    *,
    desc: str,
    progress: bool,
    log: Callable[[str], None],
) -> list[dict]:
    """The target's greedy continuation of every prompt (stopping after EOS), `batch` prompts per step, each step's
    prompts grouped by length so no row needs padding; cached in (and resumed from) the JSONL at path."""
    import torch

    records = align.resume_generations(path, header, prompts, desc, False, log)
    bar = align._bar(len(prompts), len(records), desc, progress)
    t0, made = time.time(), 0
    try:
        with open(path, "a") as fh, torch.no_grad():
            for start in range(len(records), len(prompts), batch):
                chunk = prompts[start : start + batch]
                continuation: dict[int, list[int]] = {}
                for length in sorted({len(p["prompt"]) for p in chunk}):
                    rows = [j for j, p in enumerate(chunk) if len(p["prompt"]) == length]
                    ids = torch.tensor([chunk[j]["prompt"] for j in rows], device=target.device)  # [b, length]
                    out = target.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=new_tokens,
                        do_sample=False,
                        num_beams=1,
                        eos_token_id=eos_id,
                        pad_token_id=eos_id,
                    )
                    for j, row in zip(rows, out[:, length:].tolist()):
                        continuation[j] = row[: row.index(eos_id) + 1] if eos_id in row else row
                for j, p in enumerate(chunk):
                    rec = {
                        "i": start + j,
                        "source": p["source"],
                        "prompt": p["prompt"],
                        "continuation": continuation[j],
                    }
                    fh.write(json.dumps(rec) + "\n")
                    records.append(rec)
                    made += len(continuation[j])
                fh.flush()
                if bar is not None:
                    bar.update(len(chunk))
                else:
                    log(
                        f"{desc}: {len(records)}/{len(prompts)} prompts | {made / max(time.time() - t0, 1e-9):.0f} "
                        "tok/s"
                    )
    finally:
        if bar is not None:
            bar.close()
    return records


def greedy_data(opts, tok, target, work: Path, progress: bool, log: Callable[[str], None]) -> tuple[dict, dict]:
    """The target's greedy continuations of corpus prompts: {"train": records, "val": records} and the cache header.

    opts: any recipe's options with target, tokenizer_dir, manifest, num_prompts, eval_prompts, min_prompt_tokens,
    max_prompt_tokens, new_tokens, generate_batch and prompt_seed (`train heads`, `train nat` on a decoder-only target:
    the same settings give the same prompts, so one recipe's cached generations serve the other)."""
    vocab = align.check_compatible(opts.target, opts.target, tok)
    manifest = corpus_mod.load_manifest(opts.manifest)
    work.mkdir(parents=True, exist_ok=True)
    eos = tok.eos_token_id
    header = {
        "type": "header",
        "version": align.CACHE_VERSION,
        "target": str(opts.target),
        "target_sha256": align.model_digest(opts.target),
        "tokenizer_sha256": tokenizer_hash(opts.tokenizer_dir),
        "manifest_sha256": corpus_mod.manifest_hash(manifest),
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "new_tokens": opts.new_tokens,
        "vocab_size": vocab,
        "eos_token_id": eos,
    }
    splits = {}
    first = opts.prompt_seed  # --data-seed, else --seed
    for split, n, seed in (("train", opts.num_prompts, first), ("val", opts.eval_prompts, first + 1)):
        prompts = align.sample_prompts(manifest, tok, split, n, opts.min_prompt_tokens, opts.max_prompt_tokens, seed)
        prompts.sort(key=lambda p: len(p["prompt"]))  # neighbours share lengths: batches need no padding
        splits[split] = batched_continuations(
            work / f"generations-{split}.jsonl",
            {**header, "kind": "heads-batched", "split": split, "seed": seed},
            prompts,
            target,
            opts.new_tokens,
            eos,
            opts.generate_batch,
            desc=f"target greedy ({split})",
            progress=progress,
            log=log,
        )
    return header, splits


def greedy_features(
    opts,
    tok,
    target,
    work: Path,
    log: Callable[[str], None],
    version: int,
    build: Callable[[str, list, dict], Any],
    **key,
) -> tuple[dict, dict, float, float]:
    """greedy_data's continuations (cached in `work`), then {split: build(split, its records, cache key)}: the
    header, the built splits and the seconds of each part. The cache key of a split's features (a recipe keeps
    them in a file and rebuilds them when the key differs): their `version`, the target's hash, the recipe's own
    `key` fields, the split's record count and prompt seed (val's is that + 1)."""
    t0 = time.time()
    header, splits = greedy_data(opts, tok, target, work, opts.use_progress, log)
    time_generation = time.time() - t0
    t0 = time.time()
    built = {}
    for split, records in splits.items():
        split_key = {
            "version": version,
            "target_sha256": header["target_sha256"],
            **key,
            "records": len(records),
            "seed": opts.prompt_seed + (split == "val"),
        }
        built[split] = build(split, records, split_key)
    return header, built, time_generation, time.time() - t0


# --------------------------------------------------------------------------- features


def head_labels(sequence: list[int], first: int, num_heads: int) -> np.ndarray:
    """Labels [P, h-1] for positions first..len-2 of sequence: row t - first, column i - 2 holds token t + i."""
    seq = np.asarray(sequence, dtype=np.int64)
    positions = np.arange(first, len(seq) - 1)  # [P]: each has a next token
    offsets = positions[:, None] + np.arange(2, num_heads + 1)[None]  # [P, h-1]
    return np.where(offsets < len(seq), seq[np.minimum(offsets, len(seq) - 1)], IGNORE)


def extract_features(target, records: list[dict], num_heads: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """hidden [P, H] (float32) at every position whose next token is a continuation token, labels [P, h-1]."""
    import torch

    hidden, labels = [], []
    with torch.no_grad():
        for rec in records:
            seq = rec["prompt"] + rec["continuation"]
            first = len(rec["prompt"]) - 1  # its next token is the continuation's first
            out = target(
                input_ids=torch.tensor([seq], device=target.device), output_hidden_states=True, use_cache=False
            )
            hidden.append(out.hidden_states[-1][0, first:-1].float().cpu())  # [P_r, H]
            labels.append(torch.from_numpy(head_labels(seq, first, num_heads)))
    return torch.cat(hidden), torch.cat(labels)


def cached_features(path: Path, key: dict, target, records: list[dict], num_heads: int, log) -> tuple:
    import torch

    if path.is_file():
        blob = torch.load(path, weights_only=False)
        if blob.get("key") == key:
            log(f"reusing cached features {path} ({blob['hidden'].shape[0]:,} positions)")
            return blob["hidden"], blob["labels"]
        log(f"{path}: cached features are for other settings; recomputing")
    t0 = time.time()
    hidden, labels = extract_features(target, records, num_heads)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "hidden": hidden.half(), "labels": labels}, tmp)
    tmp.replace(path)
    log(f"features: {hidden.shape[0]:,} positions from {len(records)} sequences in {time.time() - t0:.0f}s -> {path}")
    return hidden.half(), labels


# --------------------------------------------------------------------------- loss and accuracy


def heads_loss(heads, lm_head, hidden, labels):
    """Mean over heads 2..h of CE(head i at t, token t + i). hidden [N, H], labels [N, h-1]."""
    import torch.nn.functional as F

    logits = heads(hidden.float(), lm_head)  # [N, h-1, V]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def head_accuracy(heads, lm_head, hidden, labels, batch_size: int = 1024) -> list[float]:
    """Top-1 accuracy of heads 2..h on the positions that have a label for that head."""
    import torch

    hits = torch.zeros(labels.shape[1], device=labels.device)
    total = torch.zeros(labels.shape[1], device=labels.device)
    with torch.no_grad():
        for i in range(0, hidden.shape[0], batch_size):
            pred = heads(hidden[i : i + batch_size].float(), lm_head).argmax(dim=-1)  # [n, h-1]
            y = labels[i : i + batch_size]
            valid = y != IGNORE
            hits += ((pred == y) & valid).sum(dim=0)
            total += valid.sum(dim=0)
    return (hits / total.clamp_min(1)).tolist()


# --------------------------------------------------------------------------- card


def heads_card(info: dict) -> str:
    acc = info["heldout_accuracy"]
    rows = [(1, "1.000 (the target itself)", "1.000")]
    rows += [
        (i + 2, f"{before:.3f}", f"{after:.3f}") for i, (before, after) in enumerate(zip(acc["before"], acc["after"]))
    ]
    table = "\n".join(markdown_table(("head", "before training (copy of head 1)", "after"), rows))
    return f"""# Blockwise parallel decoding heads for `{info["target"]}`

{info["num_heads"]} heads (head 1 is the target's own next-token prediction; heads 2..{info["num_heads"]} are trained):
each a one-hidden-layer feed-forward block (hidden {info["hidden_size"]} -> {info["ffn_size"]} -> {info["hidden_size"]},
ReLU) with a residual connection on the target's last hidden state, read out through the target's own LM head.
{info["parameters"]:,} parameters, fp16 ({info["bytes"]:,} bytes). Use: `draftverify generate --zoo code --method bpd`.

## Data
The target's own greedy continuations ({info["new_tokens"]} tokens) of {info["num_prompts"]} prompts of
{info["min_prompt_tokens"]}..{info["max_prompt_tokens"]} tokens cut from the *train* split of `{info["manifest"]}`
({info["train_positions"]:,} training positions); held out: {info["eval_prompts"]} prompts from the *val* split
(files never trained on, {info["eval_positions"]:,} positions). Head i at position t is trained on token t + i.

## Training
`{info["command"]}`

{info["steps"]} steps of {info["batch_size"]} positions, AdamW lr {info["lr"]} (warmup {info["warmup_steps"]}, cosine),
{info["threads"]} CPU thread(s) ({info["cpu"]}); wall time: generation {info["time_generation_s"]:.0f} s, features
{info["time_features_s"]:.0f} s, training {info["time_train_s"]:.0f} s.

## Held-out top-1 accuracy per head (the target's greedy token at t + i)
{table}
"""


# --------------------------------------------------------------------------- run


def train_heads(opts: HeadsOptions, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) data, features, training and export. Returns the facts written to heads.json."""
    opts.validate()
    import torch

    from ..drafters.blockwise import BlockwiseHeads

    opts.command = opts.command or command_line()
    tok, target = load_frozen_target(opts)
    lm_head = target.get_output_embeddings()
    work = Path(opts.work_dir)

    def features(split: str, records: list, key: dict):  # hidden states and labels [positions, H], [positions, h]
        return cached_features(work / f"features-{split}.pt", key, target, records, opts.num_heads, log)

    header, feats, time_generation, time_features = greedy_features(
        opts, tok, target, work, log, FEATURES_VERSION, features, num_heads=opts.num_heads
    )
    device = target.device  # the features train where the target ran (cached on the CPU)
    (train_h, train_y), (val_h, val_y) = ((h.to(device), y.to(device)) for h, y in (feats["train"], feats["val"]))

    # ---- 3. train the heads only
    seed_everything(opts.seed)
    heads = BlockwiseHeads.for_target(target, opts.num_heads, opts.ffn_size).float().to(device)
    key = {
        "features": header["target_sha256"],
        "num_heads": opts.num_heads,
        "ffn_size": heads.config.ffn_size,
        "train_positions": int(train_h.shape[0]),
        "batch_size": opts.batch_size,
        "seed": opts.seed,
        **opts.optimizer_key(),
    }
    run = Run(
        heads,
        opts,
        work / f"run-h{opts.num_heads}",
        key=key,
        name="heads",
        batches=lambda rng: torch.from_numpy(rng.integers(0, train_h.shape[0], opts.batch_size)),  # moved by Trainer
        loss=lambda model, batch: heads_loss(model, lm_head, train_h[batch], train_y[batch]),
        log=log,
    )
    # before: the heads as initialised (copies of head 1)
    state = fit_measured(run, lambda: head_accuracy(heads, lm_head, val_h, val_y), lambda i: f"head {i + 2}", log)
    if state["stopped"]:
        return {"stopped": True, "step": state["step"]}

    # ---- 4. export
    info = {
        "target": str(opts.target),
        "target_sha256": header["target_sha256"],
        "manifest": str(opts.manifest),
        "num_prompts": opts.num_prompts,
        "eval_prompts": opts.eval_prompts,
        "new_tokens": opts.new_tokens,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "train_positions": int(train_h.shape[0]),
        "eval_positions": int(val_h.shape[0]),
        **fit_facts(opts, state, "heldout_accuracy"),
        **run_facts(opts, target, state, generation=time_generation, features=time_features),
    }
    out = Path(opts.out_dir)
    heads.save(out, metadata={"training": info})
    info.update(
        num_heads=opts.num_heads,
        hidden_size=heads.config.hidden_size,
        ffn_size=heads.config.ffn_size,
        parameters=sum(p.numel() for p in heads.parameters()),
        bytes=(out / "heads.safetensors").stat().st_size,
    )
    (out / "README.md").write_text(heads_card(info))
    log(f"exported {opts.num_heads - 1} trained heads (fp16) to {out}")
    return info
