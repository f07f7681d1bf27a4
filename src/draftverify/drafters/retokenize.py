"""Moving text between two tokenizers, in bytes: what a draft model with its own vocabulary needs.

Both sides are kept as token ids plus the bytes they spell. A byte-level tokenizer spells every text exactly
(each id has fixed bytes, healing.token_bytes), so the committed text is the concatenation of the target's token
bytes, built one step at a time, and a draft token's place in that text is a byte offset. Nothing is decoded
from scratch: the draft's ids for the settled text are kept, and only a short window at the boundary with new
text is encoded again (a token that straddles the boundary, "re" + "turn" -> "return", is re-tokenized).

Bytes rather than str because a byte-level token may hold part of a UTF-8 character: text is handed to a
tokenizer only up to the last whole character (complete_prefix).
"""

from __future__ import annotations

from bisect import bisect_right

from ..errors import DraftVerifyError
from ..healing import token_bytes

# text every byte-faithful tokenizer spells back exactly: a leading word (a SentencePiece dummy prefix adds a
# space), runs of spaces and newlines (word-level vocabularies drop them). Common ASCII only: a byte-level
# vocabulary trained without some bytes is fine until a text needs them (the drafter then stops drafting)
PROBE = "def f(x):\n    return x  # y\n"


def complete_prefix(data: bytes | bytearray) -> int:
    """Length of the longest prefix of data that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        lead = data[n - back]
        if lead & 0xC0 == 0x80:  # a continuation byte: the character started earlier
            continue
        need = (
            1
            if lead < 0x80
            else 2
            if lead >> 5 == 0b110
            else 3
            if lead >> 4 == 0b1110
            else 4
            if lead >> 3 == 0b11110
            else 1
        )
        return n if back >= need else n - back
    return n


def common_prefix(a: bytes | bytearray, b: bytes | bytearray, start: int = 0) -> int:
    """Length of the common prefix of a and b, both known to agree on their first `start` bytes."""
    n = min(len(a), len(b))
    i = start
    step = 64
    while i < n:  # compare in blocks (C speed), then byte by byte inside the first block that differs
        j = min(n, i + step)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while a[i] == b[i]:
            i += 1
        return i
    return n


class TokenBytes:
    """A tokenizer as a byte codec: the bytes each id spells (special tokens and ids past the tokenizer spell
    nothing), and text -> ids without special tokens. Needs a fast tokenizer that spells text back byte for byte."""

    def __init__(self, tokenizer, vocab_size: int, role: str):
        if not getattr(tokenizer, "is_fast", False):
            raise DraftVerifyError(
                f"the {role}'s tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer; "
                "cross-tokenizer drafting needs one (a tokenizer.json beside the model)"
            )
        self.tokenizer = tokenizer
        self.role = role
        table = token_bytes(tokenizer, vocab_size)
        table += [None] * (vocab_size - len(table))  # logits past the tokenizer (padding rows) spell nothing
        self.spells = [b is not None for b in table]
        self.table = [b or b"" for b in table]
        self._backend = tokenizer.backend_tokenizer
        self.check_round_trip()

    def check_round_trip(self) -> None:
        """Refuse a tokenizer whose encode does not spell the text back exactly (a SentencePiece dummy prefix,
        normalisation, a word-level vocabulary that drops spaces): its byte offsets would not line up."""
        spelled = self.bytes_of(self.encode(PROBE))
        if spelled != PROBE.encode("utf-8"):
            raise DraftVerifyError(
                f"the {self.role}'s tokenizer ({type(self.tokenizer).__name__}) does not spell text back byte for byte "
                f"({PROBE!r} became {spelled.decode('utf-8', 'replace')!r}); cross-tokenizer drafting "
                "needs byte-level tokenizers (GPT-2, Llama 3, Qwen2 style BPE) on both sides"
            )

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def bytes_of(self, ids: list[int]) -> bytes:
        table = self.table
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)

    def special_prefix(self) -> list[int]:
        """The ids the tokenizer puts before a text (a BOS token), which the model was trained to see first."""
        with_specials = self.tokenizer("x", add_special_tokens=True)["input_ids"]
        plain = self.encode("x")
        for start in range(len(with_specials) - len(plain) + 1):
            if with_specials[start : start + len(plain)] == plain:
                return list(with_specials[:start])
        return []


class TokenTrack:
    """Token ids and the byte offset where each one ends in the text they spell, in order."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.ends[-1] if self.ends else 0

    def append(self, ids: list[int], codec: TokenBytes) -> None:
        end = self.nbytes
        for i in ids:
            end += len(codec.table[i]) if 0 <= i < len(codec.table) else 0
            self.ids.append(i)
            self.ends.append(end)

    def cut(self, n: int) -> None:
        del self.ids[n:], self.ends[n:]

    def within(self, nbytes: int) -> int:
        """How many leading tokens end at or before byte nbytes."""
        return bisect_right(self.ends, nbytes)

    def start_of(self, n: int) -> int:
        """Byte offset where token n starts (the end of the text of the first n tokens)."""
        return self.ends[n - 1] if n else 0


def to_target(tail_ids: list[int], draft_text: str, target: TokenBytes) -> list[int]:
    """The target tokens that spell draft_text after committed tokens ending in tail_ids.

    The committed tail's text and the draft's are encoded together, so a draft token that merges with the text
    before it is tokenized as the target tokenizes running text; when the tail does not come back as the same
    tokens (the draft's text re-merges a committed token), the draft text is encoded on its own. Either way the
    result is a continuation of the committed tokens that spells exactly draft_text.
    """
    if tail_ids:
        tail = target.bytes_of(tail_ids)
        try:
            ids = target.encode(tail.decode("utf-8") + draft_text)
        except UnicodeDecodeError:
            ids = []
        if ids[: len(tail_ids)] == tail_ids:
            return ids[len(tail_ids) :]
    return target.encode(draft_text)
