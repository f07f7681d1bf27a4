"""Model architectures of the code zoo: the presets `draftverify train lm --preset` builds, as LlamaConfigs.

Kept apart from the training loop because the GPU recipe, the timing of a training step (`train bench`) and the
tests build the same configurations.
"""

from __future__ import annotations

import time
from typing import Any

from .settings import TrainError

# The LlamaConfig fields a preset sets, in the order of PRESETS' rows (vocab_size is filled in from the tokenizer).
PRESET_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def preset_table(fields: tuple[str, ...], rows: dict[str, tuple]) -> dict[str, dict[str, Any]]:
    """{preset: {field: value}} from one row of values a preset, in `fields`' order (a table, not repeated dicts)."""
    return {name: dict(zip(fields, row, strict=True)) for name, row in rows.items()}


def preset_config(presets: dict[str, dict[str, Any]], preset: str) -> dict[str, Any]:
    """A copy of `preset`'s fields; TrainError naming the choices when there is no such preset."""
    if preset not in presets:
        raise TrainError(f"unknown preset {preset!r}; choose one of: {', '.join(presets)}")
    return dict(presets[preset])


PRESETS = preset_table(
    PRESET_FIELDS,
    {
        # ~52.5M parameters with an 8192 vocab (tied embeddings); fp16 export ~105 MB. 14x the draft, within the
        # target / draft ratios of the papers; deeper than the first zoo's target, for a far lower loss.
        "target": (576, 12, 9, 9, 1536, 2048),
        # ~3.8M parameters with an 8192 vocab (tied embeddings). Two layers, not four: a CPU decode step's cost
        # grows with the layers, and Theorem 8 rewards a low cost ratio c more than the acceptance two more layers
        # buy.
        "draft": (256, 2, 4, 4, 768, 2048),
        # for tests / smoke checks only
        "tiny": (32, 2, 2, 2, 64, 512),
    },
)


def make_config(preset: str, vocab_size: int, eos_id: int, **overrides):
    from transformers import LlamaConfig

    kw = preset_config(PRESETS, preset)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return LlamaConfig(
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        # no pad_token_id in the model config: nn.Embedding(padding_idx=...) would freeze the
        # input embedding of <|endoftext|>, which is also the document separator.  Padding is
        # declared in the tokenizer and in generation_config instead.
        pad_token_id=None,
        use_cache=True,
        **kw,
    )


def count_params(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def bench_step_time(
    preset: str = "target",
    batch_size: int = 4,
    seq_len: int = 512,
    threads: int = 1,
    steps: int = 5,
    warmup: int = 2,
    vocab_size: int = 8192,
) -> dict:
    """Mean seconds per training step (fwd+bwd+AdamW) for fp32 and bf16 autocast."""
    import torch
    from transformers import LlamaForCausalLM

    from .losses import lm_loss
    from .settings import set_threads

    set_threads(threads)
    res = {"preset": preset, "batch_size": batch_size, "seq_len": seq_len, "threads": threads}
    for bf16 in (False, True):
        torch.manual_seed(0)
        model = LlamaForCausalLM(make_config(preset, vocab_size, 0))
        model.config._attn_implementation = "sdpa"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, vocab_size, (batch_size, seq_len + 1))
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            loss = lm_loss(model, x, bf16)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        key = "bf16" if bf16 else "fp32"
        res[f"{key}_s_per_step"] = sum(times) / len(times)
        res[f"{key}_tokens_per_s"] = batch_size * seq_len / res[f"{key}_s_per_step"]
        res["params"] = count_params(model)
    res["faster"] = "bf16" if res["bf16_s_per_step"] < res["fp32_s_per_step"] else "fp32"
    return res
