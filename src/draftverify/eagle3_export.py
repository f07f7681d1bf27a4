"""`draftverify export eagle3`: a trained EAGLE-3 head as the checkpoint other engines load.

The head is already saved in the EAGLE-3 checkpoint layout (drafters/eagle3_head.py: config.json with
draft_vocab_size, one hidden layer, eagle_aux_hidden_state_layer_ids and target_hidden_size; fc / midlayer.* / norm
weights), which llama.cpp's converter (`--target-model-dir`) and vLLM's `eagle3` method read. Export checks the head
against its target, writes a clean copy with a card, and optionally the GGUF file llama.cpp's `--spec-type
draft-eagle3` runs (converted with the vendored converter against the target's folder, which holds the tokenizer).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import DraftVerifyError

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


def export_eagle3(head_dir: Path, out_dir: Path, target_dir: Path, gguf: str | None = None) -> dict[str, Path]:
    """Write out_dir/config.json + model.safetensors (+ README.md, + eagle3-<gguf>.gguf); returns the paths."""
    from .backends.gguf import convert, llama_cpp_dir
    from .drafters.eagle3_head import Eagle3Head

    if gguf is not None and gguf not in GGUF_TYPES:
        raise DraftVerifyError(f"--gguf {gguf!r}: choose one of {', '.join(GGUF_TYPES)}")
    head = Eagle3Head.load(head_dir)
    check_target(head, target_dir)
    out_dir = Path(out_dir)
    if out_dir.resolve() == Path(head_dir).resolve():
        raise DraftVerifyError(f"--out {out_dir} is the head's own folder; export to another one")
    out_dir.mkdir(parents=True, exist_ok=True)
    head.save(out_dir)
    paths = {"config": out_dir / "config.json", "weights": out_dir / "model.safetensors"}
    card = Path(head_dir) / "README.md"
    if card.is_file():
        shutil.copyfile(card, out_dir / "README.md")
    if gguf is not None:
        paths["gguf"] = convert(out_dir, out_dir / f"eagle3-{gguf}.gguf", llama_cpp_dir(), gguf, Path(target_dir))
    return paths


def check_target(head, target_dir: Path) -> None:
    """The head was trained for the model in target_dir (its LM head's fingerprint and shape)."""
    import json

    from safetensors import safe_open

    target_dir = Path(target_dir)
    config_path = target_dir / "config.json"
    if not config_path.is_file():
        raise DraftVerifyError(f"--target {target_dir}: no config.json (expected the Hugging Face target folder)")
    config = json.loads(config_path.read_text())
    name = "embed_tokens" if config.get("tie_word_embeddings") else "lm_head"
    for weights in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(weights), "pt") as f:
            found = [key for key in f.keys() if key.endswith(f"{name}.weight")]
            if found:
                import torch

                layer = torch.nn.Linear(1, 1, bias=False)
                layer.weight = torch.nn.Parameter(f.get_tensor(found[0]), requires_grad=False)
                head.check_target(layer, int(config["num_hidden_layers"]))
                return
    raise DraftVerifyError(f"--target {target_dir}: no {name}.weight in its safetensors files")
