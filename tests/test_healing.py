"""Token healing's candidate sets: on the zoo's byte-level BPE, on tiny tokenizers built here (byte-level with
partial UTF-8 tokens, SentencePiece-style with byte fallback), and the no-op cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from draftverify.healing import Healing, TokenTable, bytes_to_unicode, token_bytes

ROOT = Path(__file__).resolve().parents[1]
ZOO_TOKENIZER = ROOT / "zoo" / "code" / "tokenizer"
DOCSTRING_PROMPT = 'def add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    """\n'


@pytest.fixture(scope="module")
def zoo():
    tokenizer = AutoTokenizer.from_pretrained(ZOO_TOKENIZER)
    return tokenizer, TokenTable(tokenizer)


def test_the_byte_alphabet_is_the_tokenizers_libraries():
    assert sorted(bytes_to_unicode().values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert len(set(bytes_to_unicode().values())) == 256


def test_zoo_newline_extensions_are_every_token_that_starts_with_a_newline(zoo):
    tokenizer, table = zoo
    newline = tokenizer.convert_tokens_to_ids("\u010a")  # "Ċ": the byte-level spelling of "\n"
    got = table.extensions(b"\n")
    # brute force, independently: every non-special token whose own decoded text starts with "\n"
    special = set(tokenizer.all_special_ids)
    expected = [i for i in range(len(tokenizer)) if i not in special and tokenizer.decode([i]).startswith("\n")]
    assert got == expected
    assert newline in got and len(got) > 20
    indent = tokenizer.convert_tokens_to_ids("\u010a\u0120\u0120\u0120")  # "\n   " (the 4th space comes next)
    assert indent in got
    assert tokenizer.eos_token_id not in got


def test_zoo_docstring_prompt_is_backed_up_over_its_final_newline(zoo):
    tokenizer, table = zoo
    ids = tokenizer(DOCSTRING_PROMPT).input_ids
    healing = table.heal(ids)
    assert healing is not None
    assert healing.ids == ids[:-1] and healing.removed == "\n"
    assert healing.allowed.tolist() == table.extensions(b"\n")
    assert ids[-1] in healing.allowed.tolist()
    for token in healing.allowed.tolist():
        assert tokenizer.decode([token]).startswith("\n")


def test_zoo_no_op_cases(zoo):
    tokenizer, table = zoo
    assert table.heal(tokenizer("\n").input_ids) is None  # one token: nothing to back up to
    assert table.heal(tokenizer("x = 1").input_ids + [tokenizer.eos_token_id]) is None  # a special token last
    # a token that no other token extends: healing would only re-generate it
    lonely = next(i for i in range(1, len(tokenizer)) if table.bytes[i] and table.extensions(table.bytes[i]) == [i])
    assert table.heal([tokenizer("x").input_ids[0], lonely]) is None


def test_zoo_table_is_built_in_well_under_a_second(zoo):
    import time

    tokenizer, _ = zoo
    started = time.perf_counter()
    TokenTable(tokenizer)
    assert time.perf_counter() - started < 2.0  # 8192 tokens; on a loaded 2-core machine


# ---------------------------------------------------------------- a tiny byte-level BPE with partial UTF-8 tokens


def byte_level(text: str | bytes) -> str:
    """Bytes written in the byte-level alphabet (how byte-level vocabularies spell tokens)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return "".join(bytes_to_unicode()[b] for b in raw)


@pytest.fixture(scope="module")
def tiny():
    """256 byte tokens, an end-of-text token and a few merges, some of them only part of a character: " \\xe2",
    " \\xe2\\x82" (the start of " \u20ac") and the whole " \u20ac"."""
    vocab = {"<|endoftext|>": 0}
    for b in range(256):
        vocab[byte_level(bytes([b]))] = len(vocab)
    merges = []
    for left, right in [
        (b" ", b"\xe2"),
        (b" \xe2", b"\x82"),
        (b" \xe2\x82", b"\xac"),
        (b"\n", b" "),
        (b"\n ", b" "),
        (b"\n", b"\n"),
        (b"d", b"e"),
        (b"de", b"f"),
    ]:
        merges.append((byte_level(left), byte_level(right)))
        vocab[byte_level(left + right)] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    return tokenizer, TokenTable(tokenizer), vocab


def test_tiny_byte_level_tokens_are_read_as_bytes_partial_characters_included(tiny):
    tokenizer, table, vocab = tiny
    assert table.bytes[vocab[byte_level(b" \xe2\x82")]] == b" \xe2\x82"  # not U+FFFD: exact bytes
    assert table.bytes[vocab[byte_level(" \u20ac")]] == " \u20ac".encode()
    assert table.bytes[0] is None  # the special token is never a candidate


def test_tiny_space_extensions_compare_bytes(tiny):
    _, table, vocab = tiny
    ids = {vocab[byte_level(s)] for s in (b" ", b" \xe2", b" \xe2\x82", " \u20ac".encode())}
    assert set(table.extensions(b" ")) == ids
    assert set(table.extensions(b"\n")) == {vocab[byte_level(s)] for s in (b"\n", b"\n ", b"\n  ", b"\n\n")}
    assert table.extensions(b"def") == [vocab["def"]]


def test_tiny_heal_and_no_ops(tiny):
    tokenizer, table, vocab = tiny
    prompt = [vocab["def"], vocab[byte_level(b"\n")]]
    healing = table.heal(prompt)
    assert healing.ids == [vocab["def"]] and healing.removed == "\n"
    assert set(healing.allowed.tolist()) == set(table.extensions(b"\n"))
    assert table.heal([vocab["d"], vocab["def"]]) is None  # nothing extends "def"
    assert table.heal([vocab["d"], vocab[byte_level(b"\xe2")]]) is None  # the last token is part of a character
    assert table.heal([vocab["d"], 0]) is None  # special
    assert table.heal([vocab[byte_level(b"\n")]]) is None  # one token


# ---------------------------------------------------------------- a tiny SentencePiece-style BPE (byte fallback)


def test_sentencepiece_style_tokens_map_their_space_mark_and_byte_tokens():
    vocab = {"<unk>": 0, "<0x0A>": 1, "<0xE2>": 2, "\u2581": 3, "a": 4, "\u2581a": 5, "b": 6, "\u2581ab": 7, "ab": 8}
    merges = [("\u2581", "a"), ("a", "b"), ("\u2581a", "b")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    got = token_bytes(tokenizer)
    assert got[1] == b"\n" and got[2] == b"\xe2" and got[5] == b" a" and got[7] == b" ab" and got[0] is None
    table = TokenTable(tokenizer)
    assert table.extensions(b" a") == [5, 7]
    healing = table.heal([4, 5])
    assert healing.removed == " a" and healing.allowed.tolist() == [5, 7]


def test_completion_cuts_the_removed_text_from_the_front():
    import torch

    healing = Healing(ids=[1], removed="\n", allowed=torch.tensor([1]))
    assert healing.completion("\n    return x") == "    return x"
    assert healing.completion("") is None  # nothing decoded yet
    spaced = Healing(ids=[1], removed=" a", allowed=torch.tensor([1]))
    assert spaced.completion(" ab c") == "b c"
    assert spaced.completion("ab c") == "b c"  # a SentencePiece decoder dropped the first token's leading space
