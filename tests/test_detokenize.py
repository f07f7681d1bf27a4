"""Incremental detokenization: the pieces streamed after each push add up to the whole decode, for a byte-level
BPE that splits multi-byte characters over several tokens and for a SentencePiece-style tokenizer whose decode
of one token alone drops its leading space (a token decoded in context differs from the same token alone); each
push decodes a short window, never the whole output again; the API's on_text streamer sends exactly that."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from draftverify.api import _TextStreamer
from draftverify.detokenize import IncrementalDecoder
from draftverify.healing import TokenTable

ROOT = Path(__file__).resolve().parents[1]
TEXT = "def greet(name):\n    return f'héllo {name}, wörld: 日本語 🙂'  # über\n\n\nprint(greet('x'))\n"


@pytest.fixture(scope="module")
def byte_level():
    return AutoTokenizer.from_pretrained(ROOT / "zoo" / "code" / "tokenizer")


@pytest.fixture(scope="module")
def metaspace():
    """A SentencePiece-style BPE: spaces become '▁' and a decode drops the space at its very start."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        [TEXT] * 4, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"], show_progress=False)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def stream(decoder: IncrementalDecoder, ids: list[int], chunk: int) -> list[str]:
    pieces, shown = [], 0
    for start in range(0, len(ids), chunk):
        decoder.push(ids[start : start + chunk])
        pieces.append(decoder.text[shown:])
        shown = len(decoder.text)
    decoder.finish()
    return pieces + [decoder.text[shown:]]


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_the_pieces_add_up_to_the_whole_decode(request, kind, chunk):
    tokenizer = request.getfixturevalue(kind)
    ids = tokenizer(TEXT).input_ids
    alone = "".join(tokenizer.decode([t]) for t in ids)
    assert alone != TEXT  # each tokenizer is a case where decoding token by token goes wrong
    pieces = stream(IncrementalDecoder(tokenizer), ids, chunk)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    assert not any("\ufffd" in piece for piece in pieces)  # a split character waits for its last byte


def test_random_ids_that_split_characters_stream_as_their_whole_decode(byte_level):
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, len(byte_level), (300,), generator=gen).tolist()
        assert "".join(stream(IncrementalDecoder(byte_level), ids, 3)) == byte_level.decode(
            ids, skip_special_tokens=True
        )


def test_a_character_left_incomplete_comes_out_at_the_end_as_the_whole_decode_has_it(byte_level):
    ids = byte_level("x = '日'").input_ids
    cut = next(n for n in range(len(ids)) if byte_level.decode(ids[:n]).endswith("\ufffd"))
    decoder = IncrementalDecoder(byte_level)
    decoder.push(ids[:cut])
    assert "\ufffd" not in decoder.text
    decoder.finish()
    assert decoder.text == byte_level.decode(ids[:cut])


def test_each_push_decodes_a_short_window_not_the_whole_output(byte_level):
    """Linear in the output: the ids decoded per push stay few however long the text grows."""
    widths: list[int] = []

    class Counting:
        def decode(self, ids, **kwargs):
            widths.append(len(ids))
            return byte_level.decode(ids, **kwargs)

    ids = byte_level(TEXT * 20).input_ids
    assert "".join(stream(IncrementalDecoder(Counting()), ids, 1)) == TEXT * 20
    assert len(ids) > 500 and max(widths) <= 6


def test_with_healing_the_text_starts_after_the_original_prompt(byte_level):
    prompt = 'def f(x):\n    """Return x."""\n'
    healing = TokenTable(byte_level).heal(byte_level(prompt).input_ids)
    assert healing is not None and healing.removed == "\n"
    new = byte_level(prompt + "    return x\n").input_ids[len(healing.ids) :]
    decoder = IncrementalDecoder(byte_level, healing)
    assert "".join(stream(decoder, new, 1)) == "    return x\n" and not decoder.pending


def test_the_api_streamer_sends_the_whole_decode_in_pieces(byte_level):
    ids = byte_level(TEXT).input_ids
    pieces: list[str] = []
    streamer = _TextStreamer(byte_level, pieces.append)
    for t in ids:
        streamer.push(torch.tensor([[t]]))
    streamer.finish()
    assert "".join(pieces) == TEXT and all(pieces) and not any("\ufffd" in p for p in pieces)
