"""The model card (README.md) of a model trained from scratch by `draftverify train lm`."""

from __future__ import annotations

import math
import platform

from ..markdown import command_block


def _rope_theta(cfg: dict) -> float:
    """transformers 5 keeps rope_theta inside rope_parameters; 4.x configs kept it at the top level."""
    return (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))


def _early_exit_lines(ee) -> list[str]:
    """The BiLD 4.4 phase of `train lm --early-exit-layer`, when there was one."""
    if not ee:
        return []
    b, a, layer = ee["before"], ee["after"], ee["layer"]
    verdict = (
        f"kept: the first {layer} layers are the `early_exit` drafter's model (`--early-exit-layers {layer}`)"
        if ee["kept"]
        else f"dropped (the full model lost more than {ee['max_degradation']} nats): the weights "
        "from before the phase are exported"
    )
    return [
        f"- Early-exit phase (BiLD section 4.4) from step {ee['from_step']:,}: averaged loss of layer {layer} and "
        f"the last layer; held-out loss full model {b['full']:.4f} -> {a['full']:.4f}, layer {layer} "
        f"{b['early']:.4f} -> {a['early']:.4f}; {verdict}."
    ]


def model_card(info: dict) -> str:
    cfg = info["config"]
    cnt = info["manifest_counts"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "license: apache-2.0",
        "tags: [draftverify, code, python, llama, speculative-decoding]",
        "---",
        "",
        f"# draftverify code-{info['preset']} ({info['params'] / 1e6:.2f}M parameters)",
        "",
        f"A small `LlamaForCausalLM` trained from scratch by `draftverify train lm` as the "
        f"*{info['preset']}* model of the project's code model pair (speculative decoding experiments). "
        "It is a toy model: it completes Python source in the style of the standard library and is "
        "not meant for anything else.",
        "",
        "## Data",
        "",
        f"- Corpus: the `.py` files of the CPython {info['python_version']} standard library "
        "(excluding `site-packages` / `dist-packages`), as listed in "
        f"`{info.get('manifest', 'zoo/code/manifest.json')}`.",
        f"- Files: {cnt.get('train', 0) + cnt.get('val', 0)} "
        f"({cnt.get('train', 0)} train / {cnt.get('val', 0)} held-out validation; split by file via a hash of the "
        f"path), {info['manifest_skipped']} non-UTF-8/empty files skipped.",
        f"- Manifest hash (sha256 of the file list): `{info['manifest_hash']}`",
        f"- Tokens: {info['train_tokens']:,} train / {info['val_tokens']:,} validation "
        f"(tokenizer sha256 `{info['tokenizer_hash'][:16]}`, byte-level BPE, vocab {cfg['vocab_size']}, "
        "`<|endoftext|>` = bos/eos/pad, documents joined with eos).",
        "",
        "## Model",
        "",
        f"- Parameters: {info['params']:,} (tied input/output embeddings)",
        f"- hidden {cfg['hidden_size']}, layers {cfg['num_hidden_layers']}, heads {cfg['num_attention_heads']} "
        f"(kv {cfg['num_key_value_heads']}), intermediate {cfg['intermediate_size']}, "
        f"max positions {cfg['max_position_embeddings']}, RoPE theta {_rope_theta(cfg)}",
        "- Weights exported in float16 (safetensors); trained in "
        + ("bf16 autocast (fp32 master weights)" if info["bf16"] else "float32")
        + " on CPU.",
        "",
        *command_block("## Training", info["command"], language=""),
        "",
        f"- Sequence length {info['seq_len']}, batch {info['batch_size']} sequences "
        f"({info['seq_len'] * info['batch_size']:,} tokens/step), AdamW (betas {info['betas']}, "
        f"weight decay {info['weight_decay']}), peak LR {info['lr']}, {info['warmup_steps']} warmup steps, "
        f"cosine decay to {info['min_lr_ratio']}x, grad clip {info['grad_clip']}, seed {info['seed']}.",
        f"- Steps: {info['step']:,}; tokens seen: {info['tokens_seen']:,} "
        f"({info['tokens_seen'] / max(info['train_tokens'], 1):.2f} epochs)",
        f"- Training time: {info['elapsed'] / 60:.1f} min on {info['threads']} CPU thread(s) "
        f"({info['cpu']}), {info['tokens_per_s']:.0f} tokens/s average.",
        f"- Initialised from: {info['init_from'] or 'random init'}; resumed {info['resumes']} time(s) from checkpoint.",
        f"- Final held-out loss: {info['val_loss']:.4f} nats/token (perplexity "
        f"{math.exp(min(info['val_loss'], 50)):.2f}) on {info['val_windows']} fixed windows of the validation split.",
        *_early_exit_lines(info.get("early_exit")),
        f"- Software: torch {info['torch']}, transformers {info['transformers']}, Python {platform.python_version()}.",
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(path)",
        'model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")  # float16 weights',
        "```",
        "",
    ]
    return "\n".join(lines)
