"""Write a randomly initialised Llama target/draft pair (with the shipped code tokenizer) for smoke runs and
overhead measurements when no trained model is at hand. Usage: python scripts/random_models.py OUT_DIR"""
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]


def main(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "zoo/code/tokenizer")
    for name, hidden, layers in (("target", 512, 6), ("draft", 256, 2)):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 3,
                             num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                             max_position_embeddings=1024, tie_word_embeddings=True,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        LlamaForCausalLM(config).save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
        print(f"wrote {out / name} ({layers} layers, hidden {hidden})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
