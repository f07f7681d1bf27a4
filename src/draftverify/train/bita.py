"""BiTA's bi-directional tuning (Lin et al. 2024, section 3.1) of mask and prompt tokens on a frozen target.

1. **Data.** Prompts are windows of the corpus (``align.sample_prompts``; train split for training, val split for
   the held-out accuracy). When the unpacked corpus is missing, the manifest's CPython standard-library files are
   read from this Python's own stdlib (same files: their sha256 is checked), so no download is needed. The target's
   greedy continuation of each prompt is generated **batched** (Hugging Face ``generate``, left padding, prompts of
   similar length together) and cached in a resumable JSONL.
2. **SAR loss.** For random cut points k of a continuation, M mask tokens placed at positions k+1..k+M (seeing the
   text up to k and the prompt tokens) are trained on tokens k+2..k+M+1: mask i learns the token i + 1 after the
   last real one (the target itself predicts k+1). The real text's keys and values do not depend on the adapter,
   so one no-grad forward caches them and only the C x M mask positions of a batch run with gradients.
3. **Train.** Only the adapter learns, on the shared run (``train.runner``, on transformers' Trainer: AdamW +
   warmup/cosine, budgets, a resumable SIGINT-safe checkpoint in ``work_dir/run-{prompt}-m{M}-p{P}``, one per
   adapter settings);
   held-out top-1 accuracy per mask token at the start and the end.
4. **Export.** ``BitaAdapter.save`` (fp16 + bita.json with the training facts) and a model card (``write_card``).
"""

from __future__ import annotations

import json
import sysconfig
import time
from dataclasses import KW_ONLY
from pathlib import Path
from typing import Callable

import numpy as np

from ..bench.environment import command_line
from ..markdown import markdown_table
from ..options.declare import option
from . import align, corpus as corpus_mod
from .frozen import CodeTarget, FrozenRunOptions, FrozenTarget, fit_facts, fit_measured, load_frozen_target, run_facts
from .lm import TrainError
from .runner import Run
from .settings import seed_everything, to_device
from .shared_flags import recipe_options, shared

STDLIB_DIR = "cpython-3.11.7/"  # the manifest's folder of the standard library


@recipe_options
class BitaOptions(FrozenTarget, CodeTarget, FrozenRunOptions):
    """`train bita`'s options, each its flag (the run options' too: RunOptions)."""

    manifest: str = shared(
        "zoo/code/manifest.json", "Corpus manifest JSON (without the unpacked corpus: its stdlib files, read locally)."
    )
    out_dir: str = shared("zoo/code/bita", "Where to save the adapter (safetensors + JSON + card).")
    work_dir: str = shared("runs/bita")
    prompt: str = option("deep", "--prompt", "Prompt tokens: none (mask tokens only), shallow or deep.")
    num_masks: int = option(3, "--num-masks", "M mask tokens (look-ahead positions).")
    num_prompts: int = shared(16, "P prompt tokens (shallow / deep).")
    num_train: int = option(512, "--num-train", "Training prompts from the train split.")
    eval_prompts: int = shared(32)  # held-out prompts (val split)
    min_prompt_tokens: int = shared(32)
    max_prompt_tokens: int = shared(128)
    new_tokens: int = shared(96)
    gen_batch: int = option(32, "--gen-batch", "Prompts generated together (batched greedy).")
    cuts: int = shared(16)  # cut points per sequence per step
    _: KW_ONLY
    batch_size: int = shared(8)  # sequences per step
    lr: float = shared(3e-2)  # the paper's
    checkpoint_minutes: float = shared(2.0)
    log_every: int = shared(20)

    def validate(self) -> None:
        self.validate_frozen(("num_masks", "num_train", "new_tokens", "gen_batch", "cuts"))
        if self.prompt not in ("none", "shallow", "deep"):
            raise TrainError(f"--prompt must be none, shallow or deep, got {self.prompt!r}")
        if self.prompt != "none" and self.num_prompts < 1:
            raise TrainError("--num-prompts must be >= 1 for a shallow or deep prompt")
        if self.new_tokens < self.num_masks + 2:
            raise TrainError(
                f"--new-tokens must be >= num_masks + 2 = {self.num_masks + 2} (a cut needs M + 1 tokens after it)"
            )


# --------------------------------------------------------------------------- data


def prompt_manifest(manifest_path: str, log) -> tuple[dict, str]:
    """The manifest, or when its corpus is not unpacked here, its standard-library part read from this Python."""
    manifest = corpus_mod.load_manifest(manifest_path)
    if Path(manifest["root"]).is_dir():
        return manifest, f"the corpus of {manifest_path} ({manifest['root']})"
    stdlib = sysconfig.get_paths()["stdlib"]
    files = [{**f, "path": f["path"][len(STDLIB_DIR) :]} for f in manifest["files"] if f["path"].startswith(STDLIB_DIR)]
    if not files:
        raise TrainError(
            f"the corpus of {manifest_path} is not unpacked at {manifest['root']}; run `draftverify train corpus`"
        )
    log(f"corpus not unpacked at {manifest['root']}: prompts from its {len(files)} standard-library files in {stdlib}")
    return {
        **manifest,
        "root": stdlib,
        "files": files,
    }, f"the CPython standard-library files of {manifest_path} ({stdlib})"


def batched_greedy(
    model,
    prompts: list[list[int]],
    new_tokens: int,
    eos: int | None,
    batch: int,
    pad: int,
    on_batch: Callable[[list[list[int]]], None],
) -> None:
    """The target's greedy continuation of each prompt, `batch` at a time (sorted by length, left padded); each
    continuation ends at its first EOS. on_batch receives each batch's continuations in prompt order."""
    from ..backends.hf.greedy import hf_greedy

    for start in range(0, len(prompts), batch):
        on_batch(hf_greedy(model, prompts[start : start + batch], pad, eos, new_tokens, min_new_tokens=1)[0])


def generations(
    path: Path, key: dict, prompts: list[dict], model, opts: BitaOptions, eos, pad, log, desc: str, progress: bool
) -> list[dict]:
    """Cached (resumable) greedy continuations: JSONL of a header then {"i", "prompt", "continuation"} records,
    appended batch by batch (in length order), so an interrupted run keeps every finished batch. The header (key)
    names only the data settings, not M, P or the prompt kind: adapters trained with one --work-dir share the data."""
    done: dict[int, dict] = {}
    if path.is_file():
        lines = path.read_text().splitlines()
        if lines and json.loads(lines[0]) == key:
            for row, line in enumerate(lines[1:]):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by an interruption
                    continue
                done[rec.get("i", row)] = rec
        else:
            log(f"{path}: cached generations are for other settings; regenerating")
            path.unlink()
    if not path.is_file():
        path.write_text(json.dumps(key) + "\n")
    todo = sorted((i for i in range(len(prompts)) if i not in done), key=lambda i: len(prompts[i]["prompt"]))
    if not todo:
        log(f"{desc}: all {len(prompts)} continuations cached in {path}")
    else:
        bar = align._bar(len(prompts), len(prompts) - len(todo), desc, progress)
        order = iter(todo)

        def keep(rows):
            with path.open("a") as fh:
                for row in rows:
                    i = next(order)
                    done[i] = {"i": i, "prompt": prompts[i]["prompt"], "continuation": row}
                    fh.write(json.dumps(done[i]) + "\n")
            if bar is not None:
                bar.update(len(rows))
            else:
                log(f"{desc}: {len(done)}/{len(prompts)}")

        batched_greedy(model, [prompts[i]["prompt"] for i in todo], opts.new_tokens, eos, opts.gen_batch, pad, keep)
        if bar is not None:
            bar.close()
    return [done[i] for i in range(len(prompts))]


# --------------------------------------------------------------------------- the SAR loss


def sar_batch(records: list[dict], num_masks: int, cuts: int, rng: np.random.Generator, pad: int):
    """Right-padded sequences [B, T], cut points [B, C] (the last real token each mask group follows) and labels
    [B, C, M] (tokens k+2..k+M+1), for records whose continuation is long enough."""
    import torch

    seqs, ks, labels = [], [], []
    for rec in records:
        seq = rec["prompt"] + rec["continuation"]
        lo, hi = len(rec["prompt"]) - 1, len(seq) - num_masks - 2  # k in [lo, hi]
        if hi < lo:
            continue
        k = rng.integers(lo, hi + 1, cuts)
        seqs.append(seq)
        ks.append(k)
        labels.append(np.asarray(seq)[k[:, None] + 2 + np.arange(num_masks)[None]])
    if not seqs:
        raise TrainError("no continuation is long enough for a cut point; raise --new-tokens")
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    return ids, torch.from_numpy(np.stack(ks)), torch.from_numpy(np.stack(labels))


def mask_logits(model, adapter, ids, cut, prefix=None):
    """Logits [B, C, M, V] of M mask tokens after each cut k [B, C] of sequences ids [B, T] (one no-grad forward
    of the text, then the B x C x M mask positions with the prompt; gradients reach the adapter only)."""
    import torch
    from transformers.cache_utils import DynamicCache

    from ..backends.hf.cache import cache_argument
    from ..backends.hf.prefix import attend_prefix, prefix_columns, prefix_length

    batch, width = ids.shape
    m, c = adapter.config.num_masks, cut.shape[1]
    device, dtype = ids.device, next(model.parameters()).dtype
    cache = DynamicCache()
    with torch.no_grad():
        model.base_model(input_ids=ids, **{cache_argument(model.base_model): cache}, use_cache=True)
    prefix = adapter.prefix(model) if prefix is None else prefix
    if prefix is not None:  # float32 weights learning; the keys and values join a cache in the target's dtype
        prefix = tuple((k.to(dtype), v.to(dtype)) for k, v in prefix)
    group = torch.arange(c * m, device=device) // m  # [C*M] which cut each mask row belongs to
    slot = torch.arange(c * m, device=device) % m  # [C*M] which mask token
    positions = cut[:, group] + 1 + slot  # [B, C*M]
    sees_text = torch.arange(width, device=device)[None, None] <= cut[:, group][..., None]  # [B, C*M, T]
    same_group = (group[:, None] == group[None]) & (slot[:, None] >= slot[None])  # [C*M, C*M]
    visible = torch.cat([sees_text, same_group[None].expand(batch, -1, -1)], dim=-1)  # [B, C*M, T + C*M]
    visible = prefix_columns(visible, torch.ones(c * m, dtype=torch.bool, device=device), prefix_length(prefix))
    additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
    additive = additive[:, None]  # [B, 1, C*M, P + T + C*M]
    embeds = adapter.mask_embeds.to(dtype).repeat(c, 1)[None].expand(batch, -1, -1)  # [B, C*M, H]
    with attend_prefix(cache, prefix):
        out = model(
            inputs_embeds=embeds,
            position_ids=positions,
            attention_mask=additive,
            **{cache_argument(model): cache},
            use_cache=True,
        )
    return out.logits.view(batch, c, m, -1)


def sar_loss(model, adapter, ids, cut, labels):
    """The paper's SAR loss: mean cross-entropy of each mask token on its label."""
    import torch.nn.functional as F

    logits = mask_logits(model, adapter, ids, cut)  # [B, C, M, V]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def mask_accuracy(model, adapter, records: list[dict], cuts: int, seed: int, pad: int, batch: int = 8) -> list[float]:
    """Held-out top-1 accuracy of each mask token (fixed cut points)."""
    import torch

    rng = np.random.default_rng(seed)
    hits = torch.zeros(adapter.config.num_masks, device=model.device)
    total = 0
    with torch.no_grad():
        for i in range(0, len(records), batch):
            drawn = sar_batch(records[i : i + batch], adapter.config.num_masks, cuts, rng, pad)
            ids, cut, labels = to_device(drawn, model.device)
            pred = mask_logits(model, adapter, ids, cut).argmax(dim=-1)  # [B, C, M]
            hits += (pred == labels).float().sum(dim=(0, 1))
            total += labels.shape[0] * labels.shape[1]
    return (hits / max(total, 1)).tolist()


# --------------------------------------------------------------------------- card


def card(info: dict) -> str:
    acc = info["heldout_accuracy"]
    rows = [(i + 1, f"+{i + 2}", f"{b:.3f}", f"{a:.3f}") for i, (b, a) in enumerate(zip(acc["before"], acc["after"]))]
    table = "\n".join(
        markdown_table(("mask", "predicts (after the last real token)", "before training", "after"), rows)
    )
    prompt = {
        "none": "no prompt tokens (mask tokens only)",
        "shallow": f"{info['num_prompts']} shallow prompt tokens (input embeddings)",
        "deep": f"{info['num_prompts']} deep prompt tokens (learned keys and values in each of the "
        f"{info['num_layers']} layers)",
    }[info["prompt"]]
    return f"""# BiTA adapter for `{info["target"]}`

Bi-directional tuning (Lin et al. 2024): {info["num_masks"]} learned mask tokens and {prompt}, seen by the
mask tokens only, on the frozen target. {info["parameters"]:,} parameters ({info["parameter_share"]:.3%} of the
target's {info["target_parameters"]:,}), fp16 ({info["bytes"]:,} bytes). Use: `draftverify generate --zoo code
--method bita` (efficient tree), `bita_tree` (full top-k tree), `bita_chain` (straightforward).

## Data
Prompts: {info["prompt_source"]}; {info["num_train"]} prompts of \
{info["min_prompt_tokens"]}..{info["max_prompt_tokens"]}
tokens from the *train* split, held out: {info["eval_prompts"]} from the *val* split. Labels: the target's own
greedy continuations (up to {info["new_tokens"]} tokens, generated {info["gen_batch"]} prompts at a time).

## Training
`{info["command"]}`

SAR loss over the mask tokens at {info["cuts"]} random cut points per sequence, {info["batch_size"]} sequences
per step, {info["steps"]} steps, AdamW lr {info["lr"]} (warmup {info["warmup_steps"]}, cosine), {info["threads"]}
CPU thread(s) ({info["cpu"]}); wall time: generation {info["time_generation_s"]:.0f} s, training
{info["time_train_s"]:.0f} s.

## Held-out top-1 accuracy per mask token
{table}
"""


def write_card(folder: str | Path) -> Path:
    """Render folder/README.md from folder/bita.json (the training report the run saved)."""
    folder = Path(folder)
    info = json.loads((folder / "bita.json").read_text())
    facts = {**info["training"], **{k: info[k] for k in ("num_masks", "num_prompts", "prompt", "num_layers")}}
    (folder / "README.md").write_text(card(facts))
    return folder / "README.md"


# --------------------------------------------------------------------------- run


def train_bita(opts: BitaOptions, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) data, training and export. Returns the training facts written to bita.json."""
    opts.validate()

    from ..drafters.bita_adapter import BitaAdapter

    opts.command = opts.command or command_line()
    progress = opts.use_progress
    tok, target = load_frozen_target(opts)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
    manifest, source = prompt_manifest(opts.manifest, log)
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    digest = align.model_digest(opts.target)

    # ---- 1. the target's greedy continuations (batched, cached)
    t0 = time.time()
    splits = {}
    for split, n, seed in (("train", opts.num_train, opts.seed), ("val", opts.eval_prompts, opts.seed + 1)):
        prompts = align.sample_prompts(manifest, tok, split, n, opts.min_prompt_tokens, opts.max_prompt_tokens, seed)
        key = {
            "kind": "bita-generations",
            "split": split,
            "seed": seed,
            "target_sha256": digest,
            "prompts": n,
            "min_prompt_tokens": opts.min_prompt_tokens,
            "max_prompt_tokens": opts.max_prompt_tokens,
            "new_tokens": opts.new_tokens,
            "source": source,
        }
        splits[split] = generations(
            work / f"generations-{split}.jsonl",
            key,
            prompts,
            target,
            opts,
            eos,
            pad,
            log,
            f"target greedy ({split})",
            progress,
        )
    time_generation = time.time() - t0
    train, val = splits["train"], splits["val"]

    # ---- 2. train the adapter only (one run per adapter settings; the work dir's generations serve them all)
    seed_everything(opts.seed)
    adapter = BitaAdapter.for_target(target, opts.num_masks, opts.prompt, opts.num_prompts).float().to(target.device)
    key = {
        "target_sha256": digest,
        "prompt": opts.prompt,
        "num_masks": opts.num_masks,
        "num_prompts": opts.num_prompts,
        "records": len(train),
        "batch_size": opts.batch_size,
        "cuts": opts.cuts,
        "seed": opts.seed,
        **opts.optimizer_key(),
    }

    def batches(rng):
        chosen = rng.integers(0, len(train), opts.batch_size)
        return sar_batch([train[i] for i in chosen], opts.num_masks, opts.cuts, rng, pad)

    run = Run(
        adapter,
        opts,
        work / f"run-{opts.prompt}-m{opts.num_masks}-p{opts.num_prompts}",
        key=key,
        name="bita",
        batches=batches,
        loss=lambda model, batch: sar_loss(target, model, *batch),
        log=log,
    )
    state = fit_measured(
        run, lambda: mask_accuracy(target, adapter, val, opts.cuts, opts.seed, pad), lambda i: f"mask {i + 1}", log
    )
    if state["stopped"]:
        return {"stopped": True, "step": state["step"]}

    # ---- 3. export
    parameters = sum(p.numel() for p in adapter.parameters())
    target_parameters = sum(p.numel() for p in target.parameters())
    info = {
        "target": str(opts.target),
        "target_sha256": digest,
        "manifest": str(opts.manifest),
        "prompt_source": source,
        "num_train": len(train),
        "eval_prompts": len(val),
        "new_tokens": opts.new_tokens,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "gen_batch": opts.gen_batch,
        "cuts": opts.cuts,
        **fit_facts(opts, state, "heldout_accuracy"),
        "parameters": parameters,
        "target_parameters": target_parameters,
        "parameter_share": parameters / target_parameters,
        **run_facts(opts, target, state, generation=time_generation),
    }
    out = Path(opts.out_dir)
    adapter.save(out, metadata={"training": info})
    info["bytes"] = (out / "bita.safetensors").stat().st_size
    adapter.save(out, metadata={"training": info})
    write_card(out)
    log(
        f"exported the BiTA adapter ({parameters:,} parameters, {info['parameter_share']:.3%} of the target's) to {out}"
    )
    return info
