"""retokenize: UTF-8 boundaries, common prefixes, the token track, the tokenizer as a byte codec, to_target."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from draftverify.drafters.retokenize import TokenBytes, TokenTrack, common_prefix, complete_prefix, to_target
from draftverify.errors import DraftVerifyError
from tokenizer_pairs import draft_tokenizer, target_tokenizer


@pytest.mark.parametrize("text", ["", "abc", "\u00e9t\u00e9", "a\u2192b", "x\U0001f600"])
def test_complete_prefix_cuts_only_a_trailing_partial_character(text):
    data = text.encode("utf-8")
    assert complete_prefix(data) == len(data)
    if text:
        last = text[-1].encode("utf-8")
        for cut in range(1, len(last)):  # every split inside the last character
            partial = data[: len(data) - len(last) + cut]
            assert complete_prefix(partial) == len(data) - len(last)


@pytest.mark.parametrize(
    "a, b, start, expected",
    [
        (b"", b"abc", 0, 0),
        (b"abc", b"abc", 0, 3),
        (b"abcd", b"abxd", 0, 2),
        (b"abcd", b"abxd", 2, 2),
        (b"x" * 200 + b"a", b"x" * 200 + b"b", 64, 200),
        (b"x" * 130, b"x" * 140, 0, 130),
    ],
)
def test_common_prefix(a, b, start, expected):
    assert common_prefix(a, b, start) == expected


def test_token_track_offsets():
    codec = TokenBytes(target_tokenizer(), len(target_tokenizer()), "target")
    ids = codec.encode("def f(x):\n    return x\n")
    track = TokenTrack()
    track.append(ids, codec)
    assert track.nbytes == len(b"def f(x):\n    return x\n")
    assert track.start_of(0) == 0 and track.start_of(len(ids)) == track.nbytes
    n = track.within(4)  # the tokens that end within "def "
    assert codec.bytes_of(ids[:n]) == b"def f(x):\n    return x\n"[: track.start_of(n)]
    assert track.start_of(n) <= 4 < track.start_of(n + 1) or track.start_of(n) == 4
    track.cut(2)
    assert track.ids == ids[:2] and len(track.ends) == 2


def test_special_tokens_spell_nothing():
    tok = target_tokenizer()
    codec = TokenBytes(tok, len(tok) + 5, "target")  # 5 padding logits past the tokenizer
    assert codec.bytes_of([tok.eos_token_id]) == b""
    assert not codec.spells[tok.eos_token_id] and not codec.spells[len(tok) + 2]
    assert codec.bytes_of(codec.encode("x = 1")) == b"x = 1"


def word_level_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level vocabulary: the whitespace between words is not in any token, so text cannot come back."""
    words = ["def", "f", "(", "x", "):", "return", "#", "y", ")", ":", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_a_tokenizer_that_does_not_spell_text_back_is_refused():
    tok = word_level_tokenizer()
    with pytest.raises(DraftVerifyError, match="does not spell text back byte for byte.*byte-level"):
        TokenBytes(tok, len(tok), "draft")


def test_to_target_continues_the_committed_tokens():
    target = TokenBytes(target_tokenizer(), len(target_tokenizer()), "target")
    committed = target.encode("def f(x):\n    return")
    ids = to_target(committed[-4:], " x + 1\n", target)
    assert target.bytes_of(ids) == b" x + 1\n"
    assert ids == target.encode("def f(x):\n    return x + 1\n")[len(committed) :]  # as running text tokenizes


def test_to_target_encodes_the_draft_alone_when_it_re_merges_a_committed_token():
    target = TokenBytes(target_tokenizer(), len(target_tokenizer()), "target")
    committed = target.encode("if x: re")  # " re" committed; " return" is one token of running text
    assert len(target.encode(" return")) == 1 and target.encode("if x: return y")[: len(committed)] != committed
    ids = to_target(committed[-4:], "turn y", target)
    assert target.bytes_of(ids) == b"turn y"  # spells exactly the draft's text after the committed "re"
    assert ids == target.encode("turn y")


def test_draft_and_target_tokenizers_differ():
    """The pair the cross-tokenizer tests use really tokenizes differently (else they would test nothing)."""
    text = "def forward(self, x):\n    return self.linear(x)\n"
    t, d = target_tokenizer(), draft_tokenizer()
    assert t.get_vocab() != d.get_vocab() and len(t) != len(d)
    assert t.tokenize(text) != d.tokenize(text)
