"""Token healing: back a prompt up over its last token and let the first new token re-write it.

A byte-level BPE merges a newline with the next line's indentation ("\\n    " is one token), so a prompt that ends
in a bare "\\n" token ends at a boundary no training text has: the model has only ever seen "\\n" followed by a
non-space character there, and starts a new top-level statement. Healing removes the prompt's last token and
constrains the first generated token to the vocabulary tokens whose text starts with the removed text ("\\n",
"\\n    ", "\\n\\n", ...), so the model itself chooses how the boundary is tokenized.

Hugging Face's `heal_tokens` (transformers' generation utils) does this with a trie over token *strings* and a
+10 logit bias; here the constraint is a hard mask (see loop.generate's `first_token_allowed`), and candidates are
compared as *bytes*: each token's bytes come from the tokenizer's byte-level alphabet (or SentencePiece's "\u2581"
and <0xNN> byte tokens), so tokens that hold part of a UTF-8 character compare exactly instead of as U+FFFD.
The table is a sorted list of (bytes, id) built once per tokenizer; the extensions of a prefix are one bisect and
a contiguous scan.

What exactness means with healing on: the output equals the target's own decoding of the backed-up prompt with
its first token restricted to `Healing.allowed` (greedy: argmax over the allowed tokens; sampling: the target's
distribution renormalised over them), for every method; the text returned to the user is relative to the
original prompt (the removed text, which the first token re-emits, is cut from the front).

Healing is a no-op (None) when the prompt has one token, its last token is a special token or not whole UTF-8
characters, or no other token's text extends the last token's.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

import torch

_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte-fallback tokens
_SP_SPACE = "\u2581"  # SentencePiece's visible space


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte 0..255 as one printable character (what byte-level BPE vocabularies
    are written in)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _decoder_kind(tokenizer) -> str:
    """'byte_level', 'sentencepiece' or 'other', from the fast tokenizer's decoder description."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return "other"
    try:
        description = decoder.__getstate__().decode()
    except Exception:  # a decoder that cannot describe itself: treat as unknown
        return "other"
    if '"ByteLevel"' in description:
        return "byte_level"
    if '"ByteFallback"' in description or '"Metaspace"' in description or _SP_SPACE in description:
        return "sentencepiece"
    return "other"


def token_bytes(tokenizer, vocab_size: int | None = None) -> list[bytes | None]:
    """Each token id's bytes as it sits inside a text (None for special tokens and tokens that cannot be read)."""
    size = len(tokenizer) if vocab_size is None else min(vocab_size, len(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, token in added.items() if getattr(token, "special", False)}
    kind = _decoder_kind(tokenizer)
    strings = tokenizer.convert_ids_to_tokens(list(range(size)))
    out: list[bytes | None] = []
    if kind == "byte_level":
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
    for i, token in enumerate(strings):
        if i in special or token is None:
            out.append(None)
            continue
        if i in added:  # an added (non-special) token is stored as its plain text
            out.append(str(added[i].content).encode("utf-8"))
            continue
        if kind == "byte_level":
            try:
                out.append(bytes(byte_of[c] for c in token))
            except KeyError:  # not written in the byte alphabet
                out.append(None)
        elif kind == "sentencepiece":
            match = _SP_BYTE.match(token)
            out.append(bytes([int(match.group(1), 16)]) if match else token.replace(_SP_SPACE, " ").encode("utf-8"))
        else:
            text = tokenizer.decode([i])
            out.append(None if "\ufffd" in text else text.encode("utf-8"))
    return out


@dataclass(frozen=True)
class Healing:
    """One prompt, healed: the prompt without its last token, that token's text, and the first token's choices."""

    ids: list[int]  # the backed-up prompt (every token but the last)
    removed: str  # the removed token's text; the first generated token starts with it
    allowed: torch.Tensor  # [K] long, ids of every token whose text starts with `removed` (the removed one too)

    def completion(self, decoded: str) -> str | None:
        """The text after the ORIGINAL prompt, from the decoded new tokens (which re-emit `removed` first); None
        while the decoded text does not yet hold the removed text. A SentencePiece decoder drops the leading
        space of the first token it decodes, so a removed text that starts with a space may come back without it."""
        if decoded.startswith(self.removed):
            return decoded[len(self.removed) :]
        if self.removed.startswith(" ") and decoded.startswith(self.removed[1:]) and decoded:
            return decoded[len(self.removed) - 1 :]
        return None if len(decoded) < len(self.removed) else decoded


class TokenTable:
    """The vocabulary's token bytes, sorted, for prefix look-ups. Build once per tokenizer (a Pipeline caches it)."""

    def __init__(self, tokenizer, vocab_size: int | None = None):
        self.bytes = token_bytes(tokenizer, vocab_size)  # by token id
        entries = sorted((b, i) for i, b in enumerate(self.bytes) if b)
        self._keys = [b for b, _ in entries]
        self._ids = [i for _, i in entries]

    def extensions(self, prefix: bytes) -> list[int]:
        """Ids of every token whose bytes start with prefix (the token equal to it included), ascending."""
        lo = bisect_left(self._keys, prefix)
        hi = lo
        while hi < len(self._keys) and self._keys[hi].startswith(prefix):
            hi += 1
        return sorted(self._ids[lo:hi])

    def heal(self, ids: list[int]) -> Healing | None:
        """The healing of a prompt's token ids, or None when healing would change nothing (see the module)."""
        ids = [int(i) for i in ids]
        if len(ids) < 2 or not 0 <= ids[-1] < len(self.bytes):
            return None
        last = self.bytes[ids[-1]]
        if not last:
            return None
        try:
            removed = last.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: the text after the prompt could not start cleanly
            return None
        allowed = self.extensions(last)
        if allowed == [ids[-1]] or not allowed:
            return None
        return Healing(ids=ids[:-1], removed=removed, allowed=torch.tensor(allowed, dtype=torch.long))
