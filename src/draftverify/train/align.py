"""BiLD prediction alignment (Kim et al., section 3.5.1): fine-tune the draft on the target's own greedy outputs.

1. **Calibration data.** Prompts are cut from the corpus *training* split (random windows of
   ``min_prompt_tokens..max_prompt_tokens`` tokens starting at a line boundary, one independent RNG per prompt
   index, so the first N prompts do not depend on how many are asked for). The target's greedy continuation
   of each (``new_tokens`` tokens, or up to its eos) is generated with our own loop, ``draftverify.generate``
   with the draft as drafter and the greedy verifier: that is exactly the target's greedy output, only faster.
   Each finished prompt is appended to a JSONL (header line, then ``{"i", "source", "prompt", "continuation",
   "stats"}`` records) that is reused on the next run: step 1 is resumable and cached.
2. **Fine-tune.** The draft is trained on prompt + continuation sequences with the loss on the continuation
   tokens only (the prompt is context), on the shared run (``train.runner``, on transformers' Trainer: optimizer,
   schedule, budgets, resumable SIGINT/SIGTERM-safe checkpoints); the result is exported in fp16 (``train.export``).
3. **Acceptance.** alpha (``GenerationStats.alpha``) and mean tokens per target call of the draft against the
   target, greedy, on held-out prompts cut the same way from the *validation* split (files never trained on),
   before (the original draft) and after (the exported aligned draft, loaded like ``draftverify.load`` does).
   Written into the aligned model's card (README.md) and ``alignment.json`` next to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import KW_ONLY
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..bench.environment import command_line, cpu_model
from ..markdown import command_block, markdown_table
from ..options.declare import option
from . import corpus as corpus_mod
from .export import export_model
from .losses import autocast
from .presets import count_params
from .runner import Run, load_checkpoint
from .settings import RunOptions, TrainError, seed_everything, set_threads, to_device
from .shared_flags import OWN_DATA, recipe_options, shared
from .tokenizer import TokenizerError, load_tokenizer, tokenizer_hash

CACHE_VERSION = 1
IGNORE = -100
# header fields that must agree for a cached generation file to be reused (paths may move; contents may not)
_HEADER_KEYS = (
    "version",
    "kind",
    "split",
    "target_sha256",
    "tokenizer_sha256",
    "manifest_sha256",
    "seed",
    "min_prompt_tokens",
    "max_prompt_tokens",
    "new_tokens",
    "vocab_size",
    "eos_token_id",
    "draft_sha256",
    "gamma",
)
_SPLIT_CODE = {"train": 0, "val": 1}


class AlignError(TrainError):
    """User-facing alignment error (missing inputs, incompatible models, stale caches)."""


# --------------------------------------------------------------------------- options


@recipe_options
class AlignOptions(RunOptions):
    """`train align`'s options, each its flag (the run options' too: RunOptions)."""

    target: str = shared("zoo/code/target")
    manifest: str = shared("zoo/code/manifest.json")
    data: Optional[str] = shared(None, OWN_DATA)  # read as the manifest (the command does)
    tokenizer: Optional[str] = shared(None)  # default: the target's directory
    draft: str = option("zoo/code/draft", "--draft", "Exported draft model directory to align.")
    out_dir: str = shared("zoo/code/draft-aligned", "Where to export the aligned draft.")
    work_dir: str = shared("runs/align")  # generations cache, eval caches, fine-tune checkpoint, logs
    generations: Optional[str] = option(
        None, "--generations", "Calibration generations JSONL (default: <work-dir>/generations.jsonl)."
    )
    num_prompts: int = shared(1000)
    eval_prompts: int = shared(64, "Held-out prompts from the val split for alpha before/after (0 = skip).")
    min_prompt_tokens: int = shared(64)
    max_prompt_tokens: int = shared(256)
    new_tokens: int = shared(128)
    gamma: int = option(5, "--gamma", "Draft length for generation and the alpha measurement.")
    # fine-tune; the optimizer / schedule / budget fields (keyword-only) are RunOptions'
    _: KW_ONLY
    batch_size: int = shared(16, "Sequences (prompt + continuation) per step.")
    lr: float = shared(5e-4)
    warmup_steps: int = shared(20)
    weight_decay: float = shared(0.0)

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer or self.target

    @property
    def generations_path(self) -> Path:
        return Path(self.generations) if self.generations else Path(self.work_dir) / "generations.jsonl"

    def validate(self) -> None:
        for role, d in (("target", self.target), ("draft", self.draft)):
            p = Path(d)
            if not p.is_dir():
                raise AlignError(f"--{role} {p}: directory not found (an exported model, as written by `train lm`)")
            if not (p / "config.json").is_file():
                raise AlignError(f"--{role} {p} has no config.json: expected an exported Hugging Face model dir")
        tdir = Path(self.tokenizer_dir)
        if not (tdir / "tokenizer.json").is_file():
            where = "--tokenizer" if self.tokenizer else "the target directory (default --tokenizer)"
            raise AlignError(f"no tokenizer.json in {tdir} ({where}); pass --tokenizer DIR")
        if not Path(self.manifest).exists():
            raise AlignError(f"manifest {self.manifest} not found (run `draftverify train tokenizer` first)")
        for name in ("num_prompts", "new_tokens", "gamma", "min_prompt_tokens"):
            if getattr(self, name) < 1:
                raise AlignError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.eval_prompts < 0:
            raise AlignError("--eval-prompts must be >= 0 (0 skips the acceptance measurement)")
        if self.max_prompt_tokens < self.min_prompt_tokens:
            raise AlignError(
                f"--max-prompt-tokens ({self.max_prompt_tokens}) must be >= --min-prompt-tokens "
                f"({self.min_prompt_tokens})"
            )
        try:
            self.validate_run()
        except TrainError as e:
            raise AlignError(str(e)) from None


# --------------------------------------------------------------------------- helpers


def model_digest(model_dir: str | os.PathLike) -> str:
    """sha256 over config.json and the weight files: identifies a model's contents, wherever it lives."""
    d = Path(model_dir)
    h = hashlib.sha256()
    files = [d / "config.json"] + sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin"))
    for f in files:
        if f.is_file():
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def _read_config(model_dir: str) -> dict:
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AlignError(f"cannot read {Path(model_dir) / 'config.json'}: {e}") from None


def check_compatible(target_dir: str, draft_dir: str, tok) -> int:
    """Config-level checks before any weights are loaded; returns the shared vocabulary size."""
    tc, dc = _read_config(target_dir), _read_config(draft_dir)
    tv, dv = tc.get("vocab_size"), dc.get("vocab_size")
    if tv != dv:
        raise AlignError(
            f"vocabulary mismatch: the target {target_dir} has vocab_size {tv} but the draft "
            f"{draft_dir} has {dv}; the draft must use the target's tokenizer"
        )
    if tc.get("is_encoder_decoder") or dc.get("is_encoder_decoder"):
        raise AlignError("alignment supports decoder-only models (prompt + continuation fine-tuning)")
    if tv is None or len(tok) > tv:
        raise AlignError(f"the tokenizer has {len(tok)} tokens but the models' vocab_size is {tv}")
    return int(tv)


def _load(path: str, role: str, dtype: str = "float32", device="cpu"):
    from ..api import load_model
    from ..errors import DraftVerifyError

    try:
        return load_model(path, dtype, role=role, device=device)
    except DraftVerifyError as e:
        raise AlignError(str(e)) from None


def _bar(total: int, initial: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="prompt", dynamic_ncols=True)


# --------------------------------------------------------------------------- prompts


def sample_prompts(manifest, tok, split: str, n: int, min_tokens: int, max_tokens: int, seed: int) -> list[dict]:
    """n prompts of min_tokens..max_tokens tokens, each starting at a (non-blank) line of a file of the split.

    Files are picked with probability proportional to their length; prompt i uses its own RNG seeded with
    (seed, split, i), so asking for more prompts keeps the first ones. Returns [{"prompt": ids, "source": str}].
    """
    if n <= 0:
        return []
    m = corpus_mod.load_manifest(manifest)
    files = [f["path"] for f in m["files"] if f["split"] == split]
    try:
        texts = list(corpus_mod.iter_texts(m, split))
    except corpus_mod.CorpusError as e:
        raise AlignError(str(e)) from None
    if not texts:
        raise AlignError(
            f"the {split} split of {manifest if not isinstance(manifest, dict) else 'the manifest'} "
            "has no files" + ("; use --eval-prompts 0 to skip the held-out measurement" if split == "val" else "")
        )
    lengths = np.array([len(t) for t in texts], dtype=np.float64)
    p = lengths / lengths.sum()
    backend = tok.backend_tokenizer
    line_starts: dict[int, np.ndarray] = {}
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, _SPLIT_CODE.get(split, 9), i])
        for _attempt in range(200):
            d = int(rng.choice(len(texts), p=p))
            text = texts[d]
            if d not in line_starts:
                starts = np.concatenate([[0], np.cumsum([len(line) + 1 for line in text.split("\n")])[:-1]])
                ok = [s for s in starts.tolist() if s < len(text) and not text[s].isspace()]
                line_starts[d] = np.asarray(ok, dtype=np.int64)
            if len(line_starts[d]) == 0:
                continue
            start = int(line_starts[d][rng.integers(len(line_starts[d]))])
            want = int(rng.integers(min_tokens, max_tokens + 1))
            ids = backend.encode(text[start : start + 16 * want + 64], add_special_tokens=False).ids
            if len(ids) >= want and tok.eos_token_id not in ids[:want]:
                line = text.count("\n", 0, start) + 1
                out.append({"prompt": ids[:want], "source": f"{files[d]}:{line}"})
                break
        else:
            raise AlignError(
                f"could not cut a prompt of >= {min_tokens} tokens from the {split} split after 200 "
                "tries: the files are too short; lower --min-prompt-tokens"
            )
    return out


# --------------------------------------------------------------------------- generation cache


def read_generations(path: str | os.PathLike, _with_size: bool = False):
    """(header, records) of a generations JSONL; a truncated last line (interrupted write) is ignored."""
    path = Path(path)
    if not path.is_file():
        raise AlignError(f"generations file {path} not found")
    data = path.read_bytes()
    header, records, good = None, [], 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # unterminated last line: an interrupted write
        line = data[pos:nl]
        try:
            obj = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            break
        pos = nl + 1
        if obj is None:
            good = pos
            continue
        if header is None:
            if obj.get("type") != "header":
                raise AlignError(f"{path} does not start with a draftverify generations header line")
            header = obj
        else:
            if not {"prompt", "continuation"} <= set(obj):
                raise AlignError(f"{path}: record {len(records)} lacks prompt/continuation")
            records.append(obj)
        good = pos
    if header is None:
        raise AlignError(f"{path} is empty or not a draftverify generations file")
    return (header, records, good) if _with_size else (header, records)


def resume_generations(
    path: Path, header: dict, prompts: list[dict], desc: str, reset_on_mismatch: bool, log: Callable[[str], None]
) -> list[dict]:
    """The records already cached at path for these prompts and settings (the file is created with its header when
    absent); a cache made with other settings is an error, or is deleted with reset_on_mismatch."""
    records: list[dict] = []
    if path.is_file():
        old, recs, good = read_generations(path, _with_size=True)
        diff = [k for k in _HEADER_KEYS if old.get(k) != header.get(k)]
        stale = any(r.get("i") != j for j, r in enumerate(recs)) or any(
            r["prompt"] != p["prompt"] for r, p in zip(recs, prompts)
        )
        if diff or stale:
            what = ", ".join(diff) if diff else "prompts"
            if not reset_on_mismatch:
                raise AlignError(
                    f"the cached generations {path} were made with other settings ({what} differ); "
                    "delete the file or use another --work-dir / --generations"
                )
            log(f"{path}: cached results are for other settings ({what}); regenerating")
            path.unlink()
        else:
            records = recs[: len(prompts)]
            if good < path.stat().st_size:
                with open(path, "r+b") as fh:  # drop the interrupted last line
                    fh.truncate(good)
            if records:
                log(f"{desc}: reusing {len(records)} cached continuation(s) from {path}")
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            fh.write(json.dumps(header) + "\n")
    return records


def greedy_continuations(
    path: Path,
    header: dict,
    prompts: list[dict],
    target_lm,
    draft_model,
    gamma: int,
    new_tokens: int,
    eos_id: int,
    *,
    desc: str,
    reset_on_mismatch: bool = False,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """The target's greedy continuation of every prompt, cached in (and resumed from) the JSONL at path.

    Generated by draftverify.generate with ModelDrafter(draft_model) and the greedy verifier: identical to the
    target's own greedy decoding; each record also keeps that run's GenerationStats (alpha of this draft).
    """
    import torch

    from ..drafters.model import ModelDrafter
    from ..loop import generate
    from ..types import SamplingParams
    from ..verifiers.greedy import GreedyVerifier

    records = resume_generations(path, header, prompts, desc, reset_on_mismatch, log)
    if len(records) >= len(prompts):
        return records

    drafter = ModelDrafter(draft_model)
    verifier = GreedyVerifier()
    params = SamplingParams()
    bar = _bar(len(prompts), len(records), desc, progress)
    acc = rej = calls = new = 0
    t0 = time.time()
    try:
        with open(path, "a") as fh:
            for i in range(len(records), len(prompts)):
                ids = torch.tensor([prompts[i]["prompt"]], dtype=torch.long)
                out = generate(
                    target_lm,
                    drafter,
                    verifier,
                    ids,
                    params,
                    max_new_tokens=new_tokens,
                    gamma=gamma,
                    eos_token_id=eos_id,
                )
                st = out.stats
                rec = {
                    "i": i,
                    "source": prompts[i]["source"],
                    "prompt": prompts[i]["prompt"],
                    "continuation": out.new_tokens[0].tolist(),
                    "stats": {
                        "new_tokens": st.new_tokens,
                        "target_calls": st.target_calls,
                        "drafted_tokens": st.drafted_tokens,
                        "accepted_tokens": st.accepted_tokens,
                        "rejections": st.rejections,
                        "time_total": round(st.time_total, 4),
                    },
                }
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                records.append(rec)
                acc, rej, calls, new = (
                    acc + st.accepted_tokens,
                    rej + st.rejections,
                    calls + st.target_calls,
                    new + st.new_tokens,
                )
                alpha = acc / max(acc + rej, 1)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(alpha=f"{alpha:.3f}", tok_call=f"{new / max(calls, 1):.2f}")
                elif (i + 1) % 25 == 0 or i + 1 == len(prompts):
                    el = time.time() - t0
                    log(
                        f"{desc}: {i + 1}/{len(prompts)} prompts | alpha {alpha:.3f} | "
                        f"{new / max(calls, 1):.2f} tok/call | {new / max(el, 1e-9):.1f} tok/s"
                    )
    finally:
        if bar is not None:
            bar.close()
    return records


def summarize(records: list[dict]) -> dict:
    """Aggregate GenerationStats over records: alpha = accepted / (accepted + rejections) over all steps."""
    s = {
        k: sum(r["stats"][k] for r in records)
        for k in ("new_tokens", "target_calls", "drafted_tokens", "accepted_tokens", "rejections", "time_total")
    }
    judged = s["accepted_tokens"] + s["rejections"]
    return {
        "prompts": len(records),
        "alpha": s["accepted_tokens"] / judged if judged else 0.0,
        "tokens_per_call": s["new_tokens"] / s["target_calls"] if s["target_calls"] else 0.0,
        "tokens_per_second": s["new_tokens"] / s["time_total"] if s["time_total"] > 0 else 0.0,
        **{k: v for k, v in s.items() if k != "time_total"},
        "seconds": round(s["time_total"], 2),
    }


# --------------------------------------------------------------------------- fine-tune


def make_batch(records: list[dict], pad_id: int):
    """(input ids [B, L], labels [B, L]) with labels IGNORE on prompt and padding positions (right padding)."""
    import torch

    seqs = [r["prompt"] + r["continuation"] for r in records]
    width = max(len(s) for s in seqs)
    x = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    y = torch.full((len(seqs), width), IGNORE, dtype=torch.long)
    for b, (r, s) in enumerate(zip(records, seqs)):
        x[b, : len(s)] = torch.tensor(s)
        y[b, len(r["prompt"]) : len(s)] = torch.tensor(r["continuation"])
    return x, y


def continuation_loss(model, x, y, bf16: bool, reduction: str = "mean"):
    """Cross-entropy of the continuation tokens only (position t predicts y[:, t+1])."""
    import torch.nn.functional as F

    with autocast(bf16):
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), y[:, 1:].reshape(-1), ignore_index=IGNORE, reduction=reduction
    )


def evaluate_loss(model, records: list[dict], pad_id: int, bf16: bool, batch_size: int) -> Optional[float]:
    """Mean per-token continuation loss over records (None if there are none)."""
    import torch

    if not records:
        return None
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(records), batch_size):
            x, y = to_device(make_batch(records[i : i + batch_size], pad_id), model.device)
            tot += float(continuation_loss(model, x, y, bf16, reduction="sum"))
            n += int((y[:, 1:] != IGNORE).sum())
    if was:
        model.train()
    return tot / max(n, 1)


def finetune(
    opts: AlignOptions,
    records: list[dict],
    heldout: list[dict],
    pad_id: int,
    log: Callable[[str], None] = print,
    stop_after_steps: Optional[int] = None,
) -> tuple:
    """Fine-tune the draft on records (continuation loss). Returns (model, info); info["stopped"] if interrupted.

    Runs on the shared run: checkpoints to <work_dir>/finetune/checkpoint-<step> and resumes from it automatically.
    """
    import torch
    from transformers import AutoModelForCausalLM

    ft_dir = Path(opts.work_dir) / "finetune"
    seed_everything(opts.seed)
    model = AutoModelForCausalLM.from_pretrained(opts.draft, dtype=torch.float32).to(opts.torch_device())
    model.config._attn_implementation = "sdpa"
    draft_sha = model_digest(opts.draft)
    gen_sha = hashlib.sha256(json.dumps([r["continuation"] for r in records]).encode()).hexdigest()
    ckpt = load_checkpoint(ft_dir)
    if ckpt is not None and (
        ckpt["state"].get("draft_sha256") != draft_sha or ckpt["state"].get("generations_sha256") != gen_sha
    ):
        raise AlignError(
            f"the fine-tune checkpoint in {ft_dir} belongs to another draft or calibration set; "
            "delete it or use another --work-dir"
        )

    def draw(rng):
        return make_batch([records[int(j)] for j in rng.integers(0, len(records), size=opts.batch_size)], pad_id)

    run = Run(
        model,
        opts,
        ft_dir,
        name="fine-tune",
        metric="heldout_loss",
        checkpoint=ckpt,
        log=log,
        batches=draw,
        loss=lambda m, b: continuation_loss(m, *b, run.bf16),
        evaluate=(lambda m: evaluate_loss(m, heldout, pad_id, run.bf16, opts.batch_size)) if heldout else None,
        counts=lambda b: {"tokens_seen": int(b[0].numel()), "loss_tokens_seen": int((b[1][:, 1:] != IGNORE).sum())},
        state={
            "tokens_seen": 0,
            "loss_tokens_seen": 0,
            "draft_sha256": draft_sha,
            "generations_sha256": gen_sha,
            "records": len(records),
            "heldout_loss_before": None,
            "train_loss_before": None,
        },
    )
    del ckpt
    bf16, state = run.bf16, run.state
    # a fixed slice of the calibration set, to show the fit on the training data itself
    probe = records[: min(len(records), 64)]
    if state["train_loss_before"] is None:
        state["heldout_loss_before"] = evaluate_loss(model, heldout, pad_id, bf16, opts.batch_size)
        state["train_loss_before"] = evaluate_loss(model, probe, pad_id, bf16, opts.batch_size)
        log(
            f"fine-tune: continuation loss before: calibration {state['train_loss_before']:.4f}"
            + ("" if state["heldout_loss_before"] is None else f" | held-out {state['heldout_loss_before']:.4f}")
        )
    log(
        f"fine-tune: {len(records)} sequences | batch {opts.batch_size} | lr {opts.lr} | "
        f"{'bf16 autocast' if bf16 else 'fp32'} | threads {torch.get_num_threads()} | "
        f"max steps {opts.max_steps} | max minutes {opts.max_minutes}"
    )
    result = run.fit(stop_after_steps)
    if result["stopped"]:
        return model, result
    result["train_loss_after"] = evaluate_loss(model, probe, pad_id, bf16, opts.batch_size)
    log(
        f"fine-tune done: step {result['step']} | continuation loss: calibration {result['train_loss_before']:.4f} "
        f"-> {result['train_loss_after']:.4f}"
        + (
            ""
            if result["heldout_loss"] is None
            else f" | held-out {result['heldout_loss_before']:.4f} -> {result['heldout_loss']:.4f}"
        )
        + f" | {result['elapsed'] / 60:.1f} min"
    )
    model.eval()
    return model, {**result, "bf16": bf16, "params": count_params(model)}


# --------------------------------------------------------------------------- model card


def _fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def align_card(info: dict) -> str:
    b, a = info.get("before") or {}, info.get("after") or {}
    ft = info["finetune"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "license: apache-2.0",
        "tags: [draftverify, code, python, speculative-decoding, draft-model, bild, prediction-alignment]",
        "---",
        "",
        f"# draftverify code draft, aligned to its target ({ft['params'] / 1e6:.2f}M parameters)",
        "",
        "The project's small code draft model after BiLD *prediction alignment* (Kim et al., Big Little Decoder, "
        "section 3.5.1): fine-tuned on the target model's own greedy outputs, so that it proposes what the target "
        "would write and more of its drafted tokens are accepted. Produced by `draftverify train align`.",
        "",
        "## Acceptance (held-out)",
        "",
        f"Greedy speculative decoding (`draftverify.generate`, greedy verifier, gamma {info['gamma']}) of "
        f"{b.get('prompts', 0)} prompts cut from the corpus *validation* split (files never used for training or "
        f"calibration), up to {info['new_tokens']} new tokens each. alpha is `GenerationStats.alpha` "
        "(accepted / (accepted + rejected) draft tokens, pooled over all prompts).",
        "",
    ]
    cells = [
        (name, f"{s['alpha']:.3f}", f"{s['tokens_per_call']:.2f}", s["target_calls"])
        + (f"{s['accepted_tokens']} / {s['drafted_tokens']}",)
        for name, s in (("before (original draft)", b), ("after (this model)", a))
        if s
    ]
    columns = ("draft", "alpha", "mean tokens per target call", "target calls", "accepted / drafted")
    lines += markdown_table(columns, cells)
    if info.get("exact_continuations") is not None:
        lines += [
            "",
            f"Both runs produced the target's greedy text: {info['exact_continuations']} of "
            f"{b.get('prompts', 0)} continuations identical (the greedy verifier is lossless).",
        ]
    lines += [
        "",
        "## Alignment data",
        "",
        f"- Base draft: `{info['draft']}` (sha256 `{info['draft_sha256'][:16]}`); target: `{info['target']}` "
        f"(sha256 `{info['target_sha256'][:16]}`).",
        f"- Calibration set: {info['calibration']['prompts']} prompts cut from the corpus *training* split "
        f"(manifest hash `{info['manifest_sha256'][:16]}`): random windows of {info['min_prompt_tokens']}-"
        f"{info['max_prompt_tokens']} tokens starting at a line boundary (seed {info['seed']}), each continued by "
        f"the target's greedy decoding for up to {info['new_tokens']} tokens "
        f"({info['calibration']['new_tokens']:,} continuation tokens in total). Generated with draftverify's own "
        "loop (the base draft drafts, the greedy verifier keeps exactly the target's argmax: alpha "
        f"{info['calibration']['alpha']:.3f} on this set).",
        "",
        *command_block("## Fine-tuning", info["command"], language=""),
        "",
        "- Loss: cross-entropy on the continuation tokens only (the prompt is context).",
        f"- {ft['step']:,} steps of {info['batch_size']} sequences (random with replacement), AdamW "
        f"(betas {info['betas']}, weight decay {info['weight_decay']}), peak LR {info['lr']}, "
        f"{info['warmup_steps']} warmup steps, cosine decay to {info['min_lr_ratio']}x, grad clip {info['grad_clip']}, "
        + ("bf16 autocast" if ft.get("bf16") else "float32")
        + f"; {ft['loss_tokens_seen']:,} loss tokens "
        f"({ft['loss_tokens_seen'] / max(info['calibration']['new_tokens'], 1):.2f} epochs of continuations).",
        f"- Continuation loss (nats/token): calibration {_fmt(ft.get('train_loss_before'))} -> "
        f"{_fmt(ft.get('train_loss_after'))}; held-out (the validation prompts' target continuations) "
        f"{_fmt(ft.get('heldout_loss_before'))} -> {_fmt(ft.get('heldout_loss'))}.",
        f"- Fine-tune time {ft['elapsed'] / 60:.1f} min on {info['threads']} CPU thread(s) ({info['cpu']}); "
        f"resumed {ft['resumes']} time(s).",
        "- Weights exported in float16 (safetensors) with the target's tokenizer.",
        f"- Software: torch {info['torch']}, transformers {info['transformers']}, Python {platform.python_version()}.",
        "",
        "## Usage",
        "",
        "```bash",
        f"draftverify generate --target {info['target']} --draft <this directory> --method model --prompt 'def f(x):'",
        "```",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def align(opts: AlignOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None) -> dict:
    """Run (or resume) the three steps. Returns the summary written to alignment.json."""
    opts.validate()
    import torch
    from transformers import __version__ as tf_version

    from ..backends.hf.cached_lm import CachedLM

    set_threads(opts.threads)
    command = opts.command or command_line()
    opts.command = command
    progress = opts.progress if opts.progress is not None else sys.stderr.isatty()
    try:
        tok = load_tokenizer(opts.tokenizer_dir)
    except TokenizerError as e:
        raise AlignError(str(e)) from None
    vocab = check_compatible(opts.target, opts.draft, tok)
    try:
        manifest = corpus_mod.load_manifest(opts.manifest)
    except corpus_mod.CorpusError as e:
        raise AlignError(str(e)) from None
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    target_model = _load(opts.target, "target", opts.frozen_dtype(), opts.torch_device())
    draft_model = _load(opts.draft, "draft", opts.frozen_dtype(), opts.torch_device())
    target_lm = CachedLM(target_model, role="target")
    for role, m in (("target", target_lm), ("draft", CachedLM(draft_model, role="draft"))):
        if m.max_positions is not None and m.max_positions < opts.max_prompt_tokens + opts.new_tokens:
            raise AlignError(
                f"the {role} attends to {m.max_positions} positions but prompts of up to "
                f"{opts.max_prompt_tokens} tokens + {opts.new_tokens} new tokens need more; lower "
                "--max-prompt-tokens / --new-tokens"
            )
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    target_sha, draft_sha = model_digest(opts.target), model_digest(opts.draft)
    base_header = {
        "type": "header",
        "version": CACHE_VERSION,
        "target": str(opts.target),
        "target_sha256": target_sha,
        "tokenizer_sha256": tokenizer_hash(opts.tokenizer_dir),
        "manifest_sha256": corpus_mod.manifest_hash(manifest),
        "seed": opts.seed,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "new_tokens": opts.new_tokens,
        "vocab_size": vocab,
        "eos_token_id": eos,
    }

    def continuations(path: Path, header: dict, prompts: list[dict], draft, desc: str, **settings) -> list[dict]:
        """greedy_continuations of `prompts` by this run's target, drafted by `draft` (each record keeps its alpha)."""
        return greedy_continuations(
            path,
            header,
            prompts,
            target_lm,
            draft,
            opts.gamma,
            opts.new_tokens,
            eos,
            desc=desc,
            progress=progress,
            log=log,
            **settings,
        )

    def eval_header(draft, sha256: str) -> dict:
        """The cache header of a draft's held-out generations (before and after alignment: the same prompts)."""
        return {
            **base_header,
            "kind": "eval",
            "split": "val",
            "seed": opts.seed + 1,
            "draft": str(draft),
            "draft_sha256": sha256,
            "gamma": opts.gamma,
        }

    # ---- step 1: the target's greedy continuations of the calibration prompts (cached)
    t0 = time.time()
    calib_prompts = sample_prompts(
        manifest, tok, "train", opts.num_prompts, opts.min_prompt_tokens, opts.max_prompt_tokens, opts.seed
    )
    log(
        f"step 1: {len(calib_prompts)} calibration prompts from the train split "
        f"({sum(len(p['prompt']) for p in calib_prompts):,} prompt tokens) -> {opts.generations_path}"
    )
    calib = continuations(
        opts.generations_path,
        {**base_header, "kind": "calibration", "split": "train", "draft": str(opts.draft)},
        calib_prompts,
        draft_model,
        "target greedy (calibration)",
    )
    calib_summary = summarize(calib)
    log(
        f"step 1 done in {time.time() - t0:.0f}s: {calib_summary['new_tokens']:,} continuation tokens "
        f"(alpha of the base draft on them {calib_summary['alpha']:.3f})"
    )

    # ---- held-out prompts, and alpha of the original draft on them (cached)
    before = after = None
    heldout: list[dict] = []
    eval_prompts = []
    if opts.eval_prompts:
        eval_prompts = sample_prompts(
            manifest, tok, "val", opts.eval_prompts, opts.min_prompt_tokens, opts.max_prompt_tokens, opts.seed + 1
        )
        heldout = continuations(
            work / "eval_before.jsonl",
            eval_header(opts.draft, draft_sha),
            eval_prompts,
            draft_model,
            "alpha before (held-out)",
        )
        before = summarize(heldout)
        log(
            f"alpha before: {before['alpha']:.3f} | {before['tokens_per_call']:.2f} tokens per target call "
            f"({before['prompts']} held-out prompts)"
        )

    # ---- step 2: fine-tune on prompt + continuation, loss on the continuation
    model, ft = finetune(opts, calib, heldout, pad, log=log, stop_after_steps=stop_after_steps)
    if ft.get("stopped"):
        return {"stopped": True, "step": ft["step"], "work_dir": str(work)}
    out = Path(opts.out_dir)
    info = {
        "target": str(opts.target),
        "target_sha256": target_sha,
        "draft": str(opts.draft),
        "draft_sha256": draft_sha,
        "tokenizer": str(opts.tokenizer_dir),
        "manifest": str(opts.manifest),
        "manifest_sha256": base_header["manifest_sha256"],
        "seed": opts.seed,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "new_tokens": opts.new_tokens,
        "gamma": opts.gamma,
        "generations": str(opts.generations_path),
        "calibration": calib_summary,
        "before": before,
        "after": None,
        "exact_continuations": None,
        "finetune": {k: v for k, v in ft.items() if k not in ("commands",)},
        "command": "\n".join(c for c in ft.get("commands", [command]) if c) or command,
        "batch_size": opts.batch_size,
        **opts.optimizer_settings(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "transformers": tf_version,
        "out_dir": str(out),
    }
    export_model(model, tok, out, align_card(info))
    log(f"exported the aligned draft (fp16) to {out}")
    del model

    # ---- step 3: alpha of the exported aligned draft on the same held-out prompts
    if opts.eval_prompts:
        aligned = _load(str(out), "aligned draft", opts.frozen_dtype(), opts.torch_device())
        after_recs = continuations(
            work / "eval_after.jsonl",
            eval_header(out, model_digest(out)),
            eval_prompts,
            aligned,
            "alpha after (held-out)",
            reset_on_mismatch=True,
        )
        after = summarize(after_recs)
        info["after"] = after
        info["exact_continuations"] = sum(a["continuation"] == b["continuation"] for a, b in zip(after_recs, heldout))
        log(
            f"alpha after: {after['alpha']:.3f} | {after['tokens_per_call']:.2f} tokens per target call "
            f"(before: {before['alpha']:.3f} | {before['tokens_per_call']:.2f}); identical target continuations "
            f"{info['exact_continuations']}/{len(heldout)}"
        )
    (out / "README.md").write_text(align_card(info))
    text = json.dumps(info, indent=1, default=str) + "\n"
    (out / "alignment.json").write_text(text)
    (work / "alignment.json").write_text(text)
    return info
