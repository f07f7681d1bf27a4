"""`draftverify train nat --target DIR` for a decoder-only target (the code zoo): SpecDec's NAT drafter over the
target's own hidden states (drafters/nat.py, memory_window > 0).

1. **Data.** The target's greedy continuations of corpus prompts, made and cached exactly as `train heads` makes
   them (``heads.greedy_data``: batched generation, resumable JSONL; the same settings reuse its cache). They are
   what vanilla SpecDec's greedy verifier accepts: the analogue of the paper's AT-distilled targets.
2. **States.** One frozen target forward (no grad) over each full sequence (prompt + continuation) gives its
   last-layer hidden state at every position, cached in fp16 next to the generations.
3. **Train.** SpecDec 3.1 with random cut points: a cut p is the index of the pending token y_p (from the prompt's
   last token on); the drafter reads [y_p, MASK x (k-1)] and the states of positions [p - W, p) and predicts
   y_{p+1..p+k}. Each sequence carries `cuts` blocks at once (one memory, a block-diagonal self-attention mask and
   a per-block window: NatDecoder's memory_end), so the memory's projections are computed once per sequence. k is
   drawn per batch from 1..block_size; glancing as `train nat` on translation (GLAT, ratio 0.5 -> 0.3).
4. **Export.** fp16 safetensors + nat.json (training facts) + a model card with the held-out accepted slots per
   block (teacher-forced at fixed cuts of val continuations: the leading slots equal to the target's greedy
   tokens, which is what greedy verification keeps at that prefix).
"""

from __future__ import annotations

import json
import time
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..bench.environment import command_line
from ..markdown import markdown_table
from . import heads
from .frozen import FrozenTarget, GreedyPrompts, load_frozen_target
from .nat import GLANCE_END, GLANCE_START, NatRunOptions, banner, glance_ratio, glancing_loss, slot_figures
from .runner import Run, load_checkpoint
from .settings import TrainError, machine_name, seed_everything, to_device

IGNORE = -100
STATES_VERSION = 1
# the drafter's NatConfig fields its card states (its shape)
CARD_SHAPE = ("layers", "hidden_size", "heads", "ffn_size", "block_size", "memory_window")


@dataclass
class NatLMOptions(FrozenTarget, GreedyPrompts, NatRunOptions):
    """The NAT recipe's options on a decoder-only target: its prompts and greedy continuations are `train heads`'
    (GreedyPrompts, more of them), so one --work-dir's generations serve both."""

    _: KW_ONLY
    target: str
    out_dir: str
    export_dir: str = "zoo/code/nat"
    manifest: str = "zoo/code/manifest.json"
    tokenizer: Optional[str] = None  # default: the target's directory
    work_dir: str = "runs/nat-code"  # generations and hidden states (share `train heads`'s to reuse its generations)
    num_prompts: int = 700
    eval_prompts: int = 80
    generate_batch: int = 64
    block_size: int = 8
    layers: int = 2
    window: int = 64  # W: hidden states the drafter reads
    cuts: int = 16  # blocks per sequence per step
    glancing: bool = True
    batch_size: int = 8  # sequences per step
    warmup_steps: int = 50

    def validate(self) -> None:
        self.validate_frozen(
            ("num_prompts", "eval_prompts", "new_tokens", "generate_batch", "block_size", "layers", "window", "cuts")
        )


# --------------------------------------------------------------------------- states


def sequence_states(target, records: list[dict]) -> list:
    """Per record, the target's last hidden state (after the final norm) at every position of prompt +
    continuation: fp16 [T, H], from one forward without a cache."""
    import torch

    states = []
    with torch.no_grad():
        for rec in records:
            out = target(
                input_ids=torch.tensor([rec["prompt"] + rec["continuation"]], device=target.device),
                output_hidden_states=True,
                use_cache=False,
            )
            states.append(out.hidden_states[-1][0].half().cpu())
    return states


def cached_states(path: Path, key: dict, target, records: list[dict], log) -> list:
    import torch

    if path.is_file():
        blob = torch.load(path, weights_only=False)
        if blob.get("key") == key:
            log(f"reusing cached hidden states {path} ({len(blob['states'])} sequences)")
            return blob["states"]
        log(f"{path}: cached hidden states are for other settings; recomputing")
    t0 = time.time()
    states = sequence_states(target, records)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "states": states}, tmp)
    tmp.replace(path)
    log(
        f"hidden states: {sum(len(s) for s in states):,} positions of {len(records)} sequences in "
        f"{time.time() - t0:.0f}s -> {path}"
    )
    return states


# --------------------------------------------------------------------------- batches and loss


@dataclass
class Sequence:
    tokens: list[int]  # prompt + continuation, T tokens
    first: int  # the first cut: the prompt's last token (its next token is the continuation's first)
    states: "torch.Tensor"  # noqa: F821  [T, H] fp16


def sequences(records: list[dict], states: list) -> list[Sequence]:
    """The records with at least one continuation token (every cut then has a label)."""
    return [
        Sequence(r["prompt"] + r["continuation"], len(r["prompt"]) - 1, s)
        for r, s in zip(records, states)
        if r["continuation"] and len(r["prompt"]) >= 2
    ]


def block_batch(seqs: list[Sequence], k: int, cuts: list[list[int]]):
    """One step's inputs: per sequence, len(cuts[b]) blocks [y_p, MASK x (k-1)] at its cuts p.

    Returns tokens [B, n*k], slots [B, n*k] bool, targets [B, n*k] (block j's column i predicts y_{p+1+i}; -100
    past the sequence's end), memory [B, S, H] float (right-padded states) and memory_end [B, n] (= p: block j
    reads the states of positions < p)."""
    import torch

    B, n = len(seqs), len(cuts[0])
    S = max(len(s.tokens) for s in seqs)
    tokens = torch.zeros((B, n * k), dtype=torch.long)
    targets = torch.full((B, n * k), IGNORE, dtype=torch.long)
    slots = torch.ones((B, n * k), dtype=torch.bool)
    slots[:, ::k] = False
    memory = torch.zeros((B, S, seqs[0].states.shape[1]))
    for b, (s, row) in enumerate(zip(seqs, cuts)):
        memory[b, : len(s.tokens)] = s.states.float()
        for j, p in enumerate(row):
            tokens[b, j * k] = s.tokens[p]
            labels = s.tokens[p + 1 : p + 1 + k]
            targets[b, j * k : j * k + len(labels)] = torch.tensor(labels)
    return tokens, slots, targets, memory, torch.tensor(cuts)


def draw_cuts(seqs: list[Sequence], n: int, rng: np.random.Generator) -> list[list[int]]:
    """n random cuts per sequence in [first, T - 2] (a pending token with at least one token after it)."""
    return [rng.integers(s.first, len(s.tokens) - 1, size=n).tolist() for s in seqs]


def nat_lm_loss(
    nat, target, seqs: list[Sequence], k: int, n: int, rng: np.random.Generator, glance_ratio: float, bf16: bool
):
    """Mean cross-entropy over the unrevealed labelled slots (glance_ratio 0: plain SpecDec objective)."""
    batch = block_batch(seqs, k, draw_cuts(seqs, n, rng))
    tokens, slots, labels, memory, end = to_device(batch, target.device)
    run = lambda t, s: nat(target, t, s, memory, memory_end=end)  # noqa: E731
    return glancing_loss(run, tokens, slots, labels, rng, glance_ratio, bf16)


def held_out(nat, target, seqs: list[Sequence], k: int, n: int, bf16: bool, batch: int = 8) -> dict:
    """Slot cross-entropy and mean accepted slots of a k-block at fixed random cuts of held-out sequences."""
    import torch
    import torch.nn.functional as F

    from .losses import autocast

    rng = np.random.default_rng(0)
    was = nat.training
    nat.eval()
    ce = n_tok = accepted = blocks = 0.0
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            chunk = seqs[i : i + batch]
            drawn = block_batch(chunk, k, draw_cuts(chunk, n, rng))
            tokens, slots, labels, memory, end = to_device(drawn, target.device)
            with autocast(bf16):
                logits = nat(target, tokens, slots, memory, memory_end=end).float()
            valid = labels >= 0
            ce += F.cross_entropy(logits[valid], labels[valid], reduction="sum").item()
            n_tok += int(valid.sum())
            hit = (logits.argmax(dim=-1) == labels).reshape(len(chunk) * n, k)  # [blocks, k]; -100 never hits
            accepted += float(hit.int().cumprod(dim=1).sum())
            blocks += hit.shape[0]
    nat.train(was)
    return {"slot_loss": ce / max(n_tok, 1), "accepted_per_block": accepted / max(blocks, 1)}


# --------------------------------------------------------------------------- card


def nat_lm_card(info: dict) -> str:
    rows = [
        (name, f"{info[key]['slot_loss']:.3f}", f"{info[key]['accepted_per_block']:.3f}")
        for name, key in (("before training", "before"), ("after", "after"))
    ]
    table = "\n".join(markdown_table(("", "slot loss", f"mean accepted slots of {info['block_size']}"), rows))
    return f"""# SpecDec NAT drafter for `{info["target"]}` (decoder-only)

{info["layers"]} bidirectional post-LN decoder layer(s) (d {info["hidden_size"]}, {info["heads"]} heads, FFN
{info["ffn_size"]}) that fill k <= {info["block_size"]} mask slots after the last committed token in one pass,
cross-attending (ALiBi recency bias) to the target's last {info["memory_window"]} hidden states; inputs and outputs
through the target's own embedding matrix and LM head (not stored). {info["params"]:,} parameters, fp16
({info["bytes"]:,} bytes). Use: `draftverify generate --zoo code --method specdec --nat zoo/code/nat`.

## Data
The target's own greedy continuations ({info["new_tokens"]} tokens) of {info["num_prompts"]} prompts of
{info["min_prompt_tokens"]}..{info["max_prompt_tokens"]} tokens cut from the *train* split of `{info["manifest"]}`
({info["train_sequences"]} sequences); held out: {info["eval_prompts"]} prompts from the *val* split
({info["eval_sequences"]} sequences). Random cut points in the continuations, {info["cuts"]} per sequence and step,
k drawn from 1..{info["block_size"]}, glancing {info["glancing"]}.

## Training
`{info["command"]}`

{info["step"]} steps of {info["batch_size"]} sequences, AdamW lr {info["lr"]}, {info["threads"]} CPU thread(s)
({info["cpu"]}); training wall time {info["elapsed"]:.0f} s (plus {info["time_states_s"]:.0f} s of target forwards for
the hidden states; generations {info["time_generation_s"]:.0f} s, 0 when cached).

## Held-out accepted slots per block (k = {info["block_size"]}, teacher-forced at fixed cuts)
{table}
"""


# --------------------------------------------------------------------------- run


def train(opts: NatLMOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None) -> dict:
    opts.validate()
    import torch

    from ..drafters.nat import NatDecoder
    from .presets import count_params

    tok, target = load_frozen_target(opts)
    work = Path(opts.work_dir)

    def states(split: str, recs: list, key: dict) -> list:  # per sequence: its tokens and last hidden states
        return sequences(recs, cached_states(work / f"states-{split}.pt", key, target, recs, log))

    header, data, time_generation, time_states = heads.greedy_features(
        opts, tok, target, work, log, STATES_VERSION, states
    )
    train_seqs, val_seqs = data["train"], data["val"]
    if not train_seqs or not val_seqs:
        raise TrainError("no prompt had a continuation to learn from; check --manifest and --new-tokens")

    seed_everything(opts.seed)
    ckpt = load_checkpoint(Path(opts.out_dir))
    nat = NatDecoder.for_target(target, layers=opts.layers, block_size=opts.block_size, memory_window=opts.window)
    nat = nat.float().to(target.device)  # float32 weights learn; the target may run in bfloat16 on a GPU
    n_params = count_params(nat)
    run: Run

    def loss(model, batch):
        k = int(run.rng.integers(1, opts.block_size + 1))
        ratio = glance_ratio(opts.glancing, run.progress())
        return nat_lm_loss(model, target, batch, k, opts.cuts, run.rng, ratio, run.bf16)

    def evaluate(model) -> float:
        figures = held_out(model, target, val_seqs, opts.block_size, opts.cuts, run.bf16)
        return slot_figures(run, figures, opts.block_size, log, digits=3)

    run = Run(
        nat,
        opts,
        opts.out_dir,
        batches=lambda rng: [train_seqs[i] for i in rng.integers(len(train_seqs), size=opts.batch_size)],
        loss=loss,
        evaluate=evaluate,
        metric="slot_loss",
        counts=lambda b: {"sequences_seen": len(b)},
        state={"sequences_seen": 0, "accepted_per_block": None, "before": None},
        checkpoint=ckpt,
        log=log,
    )
    del ckpt
    if run.state["before"] is None:
        run.state["before"] = held_out(nat, target, val_seqs, opts.block_size, opts.cuts, run.bf16)
    before = (
        f"before training: mean accepted {run.state['before']['accepted_per_block']:.3f} of {opts.block_size} (val)"
    )
    data = f"{len(train_seqs)} sequences"
    log(banner(nat, n_params, opts, "decoder-only target", data, before, shape=f", window {opts.window}"))
    state = run.fit(stop_after_steps)
    if state["stopped"]:
        return {"step": state["step"], "stopped": True, "params": n_params}
    after = held_out(nat, target, val_seqs, opts.block_size, opts.cuts, run.bf16)
    cfg = nat.config
    info = {
        "target": opts.target,
        "target_sha256": header["target_sha256"],
        "manifest": opts.manifest,
        "num_prompts": opts.num_prompts,
        "eval_prompts": opts.eval_prompts,
        "new_tokens": opts.new_tokens,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "train_sequences": len(train_seqs),
        "eval_sequences": len(val_seqs),
        "cuts": opts.cuts,
        "glancing": [GLANCE_START, GLANCE_END] if opts.glancing else "off",
        "step": state["step"],
        "batch_size": opts.batch_size,
        "lr": opts.lr,
        "elapsed": state["elapsed"],
        "threads": torch.get_num_threads(),
        "cpu": machine_name(target.device),
        "time_generation_s": round(time_generation, 1),
        "time_states_s": round(time_states, 1),
        "before": state["before"],
        "after": after,
        "params": n_params,
        "resumes": state["resumes"],
        "command": "\n".join(state["commands"]) if state["resumes"] else (opts.command or command_line()),
    }
    out = Path(opts.export_dir)
    nat.save(out, {"training": info})
    info.update({name: getattr(cfg, name) for name in CARD_SHAPE}, bytes=(out / "nat.safetensors").stat().st_size)
    (out / "README.md").write_text(nat_lm_card(info))
    log(f"saved the NAT drafter ({info['bytes']:,} bytes fp16) and its card to {out}")
    log(json.dumps({"before": state["before"], "after": after}))
    return info
