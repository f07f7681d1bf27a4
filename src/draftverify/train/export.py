"""Export a trained model for draftverify and Hugging Face: fp16 safetensors, the tokenizer, a model card.

Every recipe exports the same way, so `draftverify.load` and `AutoModelForCausalLM.from_pretrained` read any of
them; generation_config carries the tokenizer's eos / pad (the model config keeps no pad_token_id, see
presets.make_config).
"""

from __future__ import annotations

from pathlib import Path


def export_model(model, tok, export_dir: Path, card: str) -> Path:
    """Write an fp16 copy of `model` (the fp32 original is untouched), `tok` and the card (README.md)."""
    import copy

    import torch

    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    m16 = copy.deepcopy(model).to(torch.float16)
    m16.generation_config.bos_token_id = tok.eos_token_id
    m16.generation_config.eos_token_id = tok.eos_token_id
    m16.generation_config.pad_token_id = tok.eos_token_id
    m16.save_pretrained(str(export_dir), safe_serialization=True)
    tok.save_pretrained(str(export_dir))
    (export_dir / "README.md").write_text(card)
    return export_dir
