"""Two different byte-level BPE tokenizers and tiny random models for them, for the cross-tokenizer tests.

The tokenizers are trained with `tokenizers` on the HumanEval problems the package ships (prompt + canonical solution,
ASCII lines only; a fixed text, so the tokenizers do not change when the package's code does), each on other
problems and with another vocabulary size, so their merges differ. Their alphabets are the characters of that text,
so any token sequence a random model emits is ASCII text both tokenizers can spell: the draft keeps drafting.
Imported as `from tokenizer_pairs import ...` (tests/ is on sys.path: its conftest.py lives there).
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HUMANEVAL = (
    Path(__file__).resolve().parents[1] / "src" / "draftverify" / "bench" / "data" / "humaneval" / "HumanEval.jsonl.gz"
)
EOS_TOKEN = "<|endoftext|>"
TARGET_FILES = tuple(range(0, 164, 2))  # HumanEval problem indices each tokenizer is trained on
DRAFT_FILES = tuple(range(1, 164, 2))
TARGET_VOCAB, DRAFT_VOCAB = 420, 300


@lru_cache(maxsize=None)
def _problems() -> list[str]:
    with gzip.open(HUMANEVAL, "rt") as f:
        return [row["prompt"] + row["canonical_solution"] for row in map(json.loads, f)]


def ascii_text(files: tuple[int, ...]) -> list[str]:
    lines = []
    for index in files:
        lines += [line for line in _problems()[index].splitlines(keepends=True) if line.isascii()]
    return ["".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]


@lru_cache(maxsize=None)
def bpe_tokenizer(files: tuple[int, ...], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False)
    tok.train_from_iterator(ascii_text(files), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
    )


def target_tokenizer() -> PreTrainedTokenizerFast:
    return bpe_tokenizer(TARGET_FILES, TARGET_VOCAB)


def draft_tokenizer() -> PreTrainedTokenizerFast:
    return bpe_tokenizer(DRAFT_FILES, DRAFT_VOCAB)


def llama(vocab_size: int, seed: int, scale: float = 2.5, eos: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=eos,
        pad_token_id=None,
    )
    return _random(LlamaForCausalLM, cfg, seed, scale)


def gpt2(vocab_size: int, seed: int, scale: float = 2.0, eos: int = 0) -> GPT2LMHeadModel:
    cfg = GPT2Config(
        vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=512, eos_token_id=eos, bos_token_id=eos
    )
    return _random(GPT2LMHeadModel, cfg, seed, scale)


def _random(cls, cfg, seed: int, scale: float):
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder
