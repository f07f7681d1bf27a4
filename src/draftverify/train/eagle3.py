"""An EAGLE-3 head (drafters/eagle3_head.py) trained on a frozen target's own features and greedy tokens.

1. **Data.** The target's greedy continuations of corpus prompts (`heads.greedy_data`: the same prompts, cache and
   resumable JSONL as `train heads`).
2. **Features.** One frozen target forward per prompt + continuation gives, at every position, the inputs of the
   three chosen layers (fp16, cached on disk beside the generations) and the target's greedy next token there,
   which is the label: the head learns what the target will say, which is what the verifier accepts.
3. **Train (training-time test).** The head is unrolled for k steps over every position at once: step 0 reads the
   target's features, step s reads the head's own output of step s - 1 (as when it drafts on from its own guess),
   and its attention sees the real pairs up to its anchor plus its own earlier steps at that anchor, as its cache
   does when drafting. Loss: the cross-entropy on the target's greedy token, step s weighted 0.8^s. Only the
   head learns; it reads out through the target's LM head. Resumable checkpoints and a time budget
   (``train.runner``, on transformers' Trainer).
4. **Export.** The head in the EAGLE-3 checkpoint layout (fp16) and a card with the held-out acceptance per draft
   position before and after training.
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ..bench.environment import command_line
from ..markdown import markdown_table
from ..options.declare import option
from .frozen import GreedyFeaturesOptions, fit_facts, fit_measured, load_frozen_target, run_facts
from .heads import greedy_features
from .lm import TrainError
from .runner import Run
from .settings import seed_everything, to_device
from .shared_flags import recipe_options, shared

if TYPE_CHECKING:  # torch is imported where it is used: the module loads without it
    import torch

FEATURES_VERSION = 1
STEP_DECAY = 0.8  # EAGLE-3's weight of training-time-test step s: 0.8^s


@recipe_options
class Eagle3TrainOptions(GreedyFeaturesOptions):
    """`train eagle3`'s options, each its flag (the run options' too: RunOptions)."""

    out_dir: str = shared("zoo/code/eagle3", "Where to save the head (EAGLE-3 checkpoint layout + card).")
    work_dir: str = shared("runs/eagle3")  # generations, features, checkpoint
    ttt_steps: int = option(6, "--ttt-steps", "Training-time-test steps k (the head fed its own outputs); 1..16.")
    intermediate_size: Optional[int] = option(
        None, "--intermediate-size", "The head's MLP size (default: the target's)."
    )
    _: KW_ONLY
    batch_size: int = shared(8)  # sequences per step
    lr: float = shared(1e-3)
    checkpoint_minutes: float = shared(5.0)

    def validate(self) -> None:
        self.validate_frozen(("num_prompts", "eval_prompts", "new_tokens", "generate_batch"))
        if not 1 <= self.ttt_steps <= 16:
            raise TrainError(f"--ttt-steps must be in 1..16, got {self.ttt_steps}")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise TrainError(f"--intermediate-size must be >= 1, got {self.intermediate_size}")


# --------------------------------------------------------------------------- features


def target_features(target, sequence: list[int], layers: tuple[int, ...]) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One frozen forward of `sequence` [T]: the chosen layers' inputs concatenated [T, 3H] (fp16) and the target's
    greedy next token at each position [T]."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([sequence], device=target.device)
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    fused = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # hidden_states[i]: layer i's input
    return fused.half().cpu(), out.logits[0].argmax(dim=-1).cpu()


def cached_features(path: Path, key: dict, target, records: list[dict], layers, log) -> dict:
    """{"features": [T_r, 3H] fp16 per sequence, "tokens": [T_r], "labels": [T_r]}, computed once per settings."""
    import torch

    if path.is_file():
        blob = torch.load(path, weights_only=False)
        if blob.get("key") == key:
            log(f"reusing cached features {path} ({len(blob['tokens'])} sequences)")
            return blob
        log(f"{path}: cached features are for other settings; recomputing")
    t0 = time.time()
    blob: dict = {"key": key, "features": [], "tokens": [], "labels": []}
    for rec in records:
        sequence = rec["prompt"] + rec["continuation"]
        fused, labels = target_features(target, sequence, layers)
        blob["features"].append(fused)
        blob["tokens"].append(torch.tensor(sequence))
        blob["labels"].append(labels)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
    positions = sum(len(t) for t in blob["tokens"])
    log(f"features: {positions:,} positions of {len(records)} sequences in {time.time() - t0:.0f}s -> {path}")
    return blob


def padded_batch(blob: dict, rows) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Sequences `rows` right-padded: features [B, T, 3H], tokens [B, T], labels [B, T], valid [B, T] (bool)."""
    import torch

    lengths = [len(blob["tokens"][r]) for r in rows]  # the sequences stay on the CPU; the run moves batches
    width = max(lengths)
    pad = torch.nn.utils.rnn.pad_sequence
    features = pad([blob["features"][r] for r in rows], batch_first=True)
    tokens = pad([blob["tokens"][r] for r in rows], batch_first=True)
    labels = pad([blob["labels"][r] for r in rows], batch_first=True)
    valid = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return features, tokens, labels, valid


# --------------------------------------------------------------------------- training-time test


def unrolled_logits(head, embed, lm_head, features, tokens, steps: int) -> list["torch.Tensor"]:
    """The head unrolled `steps` times over every anchor of right-padded sequences at once.

    features [B, T, 3H], tokens [B, T]. Step s at anchor j reads token j + 1 + s with g = fc(features_j) (s = 0)
    or the prenorm state of step s - 1 at anchor j, sits at position j + s, attends to step 0's pairs 0..j and to
    its own steps 1..s at anchor j (what the head's cache holds when it drafts s tokens past j), and predicts token
    j + 2 + s. Returns per step the logits [B, T - 1 - s, V] of anchors 0..T-2-s."""
    import torch

    layer = head.midlayer
    attn = layer.self_attn
    scale = attn.c.head_dim**-0.5
    width = tokens.shape[1]
    g = head.fc(features.to(head.fc.weight.dtype))  # [B, T, H]
    keys: list[torch.Tensor] = []  # step t's keys [B, heads, T-1-t, d] (step 0: every pair)
    values: list[torch.Tensor] = []
    out = []
    for s in range(steps):
        n = width - 1 - s  # anchors whose input token j + 1 + s exists
        if n < 1:
            break
        g = g[:, :n]
        x = layer.attention_input(embed(tokens[:, 1 + s : 1 + s + n]), g)  # [B, n, 2H]
        positions = (torch.arange(n, device=x.device) + s)[None]
        q, k, v = attn.qkv(x, positions)  # [B, heads, n, d]
        keys.append(k)
        values.append(v)
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        base = (q @ keys[0][:, :, :n].transpose(-1, -2)) * scale  # [B, heads, n, n] step 0's pairs
        base = base.masked_fill(~causal, float("-inf"))
        diagonal = [(q * keys[t][:, :, :n]).sum(-1, keepdim=True) * scale for t in range(1, s + 1)]  # [B, h, n, 1]
        weights = torch.cat([base, *diagonal], dim=-1).softmax(dim=-1)  # [B, heads, n, n + s]
        attended = weights[..., :n] @ values[0][:, :, :n]
        for t in range(1, s + 1):
            attended = attended + weights[..., n + t - 1 : n + t] * values[t][:, :, :n]
        g = layer.finish(attended, g)  # prenorm [B, n, H]: the next step's g
        out.append(head.logits(g, lm_head))
    return out


def ttt_loss(head, embed, lm_head, batch, steps: int) -> "torch.Tensor":
    """Sum over steps of 0.8^s times the mean cross-entropy of step s on the target's greedy tokens."""
    import torch.nn.functional as F

    features, tokens, labels, valid = batch
    total, weight = 0.0, 0.0
    for s, logits in enumerate(unrolled_logits(head, embed, lm_head, features, tokens, steps)):
        n = logits.shape[1]
        target = labels[:, 1 + s : 1 + s + n].masked_fill(~valid[:, 1 + s : 1 + s + n], -100)
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=-100)
        total = total + STEP_DECAY**s * loss
        weight += STEP_DECAY**s
    return total / weight


def acceptance(head, embed, lm_head, blob: dict, steps: int, batch_size: int = 8, device=None) -> list[float]:
    """Held-out acceptance per draft position: the share of anchors whose first s + 1 drafted tokens all equal the
    target's greedy tokens (what a greedy verifier accepts from a chain drafted there), s = 0..steps-1."""
    import torch

    hits = [0] * steps
    total = [0] * steps
    with torch.no_grad():
        for i in range(0, len(blob["tokens"]), batch_size):
            rows = range(i, min(i + batch_size, len(blob["tokens"])))
            features, tokens, labels, valid = to_device(padded_batch(blob, rows), device or head.fc.weight.device)
            alive = None
            for s, logits in enumerate(unrolled_logits(head, embed, lm_head, features, tokens, steps)):
                n = logits.shape[1]
                right = logits.argmax(dim=-1) == labels[:, 1 + s : 1 + s + n]  # [B, n]
                ok = valid[:, 1 + s : 1 + s + n]
                alive = right if alive is None else alive[:, :n] & right
                hits[s] += int((alive & ok).sum())
                total[s] += int(ok.sum())
    return [h / max(t, 1) for h, t in zip(hits, total)]


# --------------------------------------------------------------------------- card


def eagle3_card(info: dict) -> str:
    before, after = info["heldout_acceptance"]["before"], info["heldout_acceptance"]["after"]
    rows = [(i + 1, f"{b:.3f}", f"{a:.3f}") for i, (b, a) in enumerate(zip(before, after))]
    table = "\n".join(markdown_table(("draft position i", "before training", "after"), rows))
    expected = sum(after)
    return f"""# EAGLE-3 head for `{info["target"]}`

One Llama decoder layer (hidden {info["hidden_size"]}, MLP {info["intermediate_size"]}) on the inputs of target
layers {info["aux_layers"]} (fc {3 * info["hidden_size"]} -> {info["hidden_size"]}), reading out through the target's
own LM head: {info["parameters"]:,} parameters, fp16 ({info["bytes"]:,} bytes), in the EAGLE-3 checkpoint layout
(config.json + model.safetensors). Use: `draftverify generate --zoo code --method eagle3`; for llama.cpp and vLLM:
`draftverify export eagle3 {info["out_dir"]} --out DIR`.

## Data
The target's own greedy continuations ({info["new_tokens"]} tokens) of {info["num_prompts"]} prompts of
{info["min_prompt_tokens"]}..{info["max_prompt_tokens"]} tokens cut from the *train* split of `{info["manifest"]}`
({info["train_positions"]:,} positions); held out: {info["eval_prompts"]} prompts from the *val* split. Labels: the
target's greedy next token at every position.

## Training
`{info["command"]}`

Training-time test over {info["ttt_steps"]} steps; {info["steps"]} optimizer steps of {info["batch_size"]} sequences,
AdamW lr {info["lr"]} (warmup {info["warmup_steps"]}, cosine), {info["threads"]} CPU thread(s) ({info["cpu"]});
wall time: generation {info["time_generation_s"]:.0f} s, features {info["time_features_s"]:.0f} s, training
{info["time_train_s"]:.0f} s.

## Held-out acceptance per draft position
The share of held-out positions where the head's first i drafted tokens all equal the target's greedy tokens
(teacher-forced inputs, as the training-time test runs them). Their sum, {expected:.2f}, is the expected number of
accepted tokens per verify pass of a greedy chain of {info["ttt_steps"]}.

{table}
"""


# --------------------------------------------------------------------------- run


def train_eagle3(opts: Eagle3TrainOptions, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) data, features, training and export. Returns the facts written to the card."""
    opts.validate()

    from ..drafters.eagle3_head import Eagle3Config, Eagle3Head

    opts.command = opts.command or command_line()
    tok, target = load_frozen_target(opts)
    if target.config.is_encoder_decoder:
        raise TrainError("an EAGLE-3 head drafts for a decoder-only target")
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    config = Eagle3Config.for_target(target.config, lm_head, opts.intermediate_size)
    work = Path(opts.work_dir)

    def features(split: str, records: list, key: dict):  # the layers' inputs and the greedy tokens per sequence
        return cached_features(work / f"eagle3-features-{split}.pt", key, target, records, config.aux_layers, log)

    header, data, time_generation, time_features = greedy_features(
        opts, tok, target, work, log, FEATURES_VERSION, features, layers=list(config.aux_layers)
    )
    train, val = data["train"], data["val"]

    seed_everything(opts.seed)
    head = Eagle3Head(config).float().to(target.device)
    key = {
        "features": header["target_sha256"],
        "config": [config.intermediate_size, *config.aux_layers],
        "ttt_steps": opts.ttt_steps,
        "sequences": len(train["tokens"]),
        "batch_size": opts.batch_size,
        "seed": opts.seed,
        **opts.optimizer_key(),
    }
    run = Run(
        head,
        opts,
        work / "run",
        key=key,
        name="eagle3",
        batches=lambda rng: rng.integers(0, len(train["tokens"]), opts.batch_size).tolist(),
        loss=lambda model, rows: ttt_loss(
            model, embed, lm_head, to_device(padded_batch(train, rows), target.device), opts.ttt_steps
        ),
        log=log,
    )
    state = fit_measured(
        run,
        lambda: acceptance(head, embed, lm_head, val, opts.ttt_steps, device=target.device),
        lambda i: f"position {i + 1}",
        log,
    )
    if state["stopped"]:
        return {"stopped": True, "step": state["step"]}

    info = {
        "target": str(opts.target),
        "manifest": str(opts.manifest),
        "out_dir": str(opts.out_dir),
        "num_prompts": opts.num_prompts,
        "eval_prompts": opts.eval_prompts,
        "new_tokens": opts.new_tokens,
        "min_prompt_tokens": opts.min_prompt_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "train_positions": sum(len(t) for t in train["tokens"]),
        "ttt_steps": opts.ttt_steps,
        **fit_facts(opts, state, "heldout_acceptance"),
        **run_facts(opts, target, state, generation=time_generation, features=time_features),
    }
    out = Path(opts.out_dir)
    head = Eagle3Head(Eagle3Config(**{**config.__dict__, "training": info}))
    head.load_state_dict(run.model.state_dict())
    head.save(out)
    info.update(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        aux_layers=list(config.aux_layers),
        parameters=sum(p.numel() for p in head.parameters()),
        bytes=(out / "model.safetensors").stat().st_size,
    )
    (out / "README.md").write_text(eagle3_card(info))
    log(f"exported the EAGLE-3 head (fp16) to {out}")
    return info
