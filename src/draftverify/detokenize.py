"""Token ids to text as they arrive, for streaming: each push decodes only the ids since the last settled
boundary, never the whole output again (what the API's on_text and the server's stop strings need every step).

Two decodes from a shared prefix, as vLLM does: ids[prefix:read] (already turned into text) and ids[prefix:];
the new text is what the second adds to the first. Decoding from a few ids back rather than from the new ids
alone keeps tokenizers right that drop or add a leading space at the start of a decode (SentencePiece), and a
byte-level token that ends inside a UTF-8 character is held back until the character is complete.
"""

from __future__ import annotations

from .healing import Healing


class IncrementalDecoder:
    """`text`: the complete characters of the ids pushed so far. With token healing, `text` starts after the
    original prompt: the removed text that the first new token re-emits is cut once it is all decoded, and
    `pending` is True until then (nothing can be shown yet)."""

    def __init__(self, tokenizer, healing: Healing | None = None):
        self.tokenizer = tokenizer
        self.healing = healing
        self.ids: list[int] = []
        self.text = ""
        self.prefix = 0  # ids[prefix:read] decode to the end of self.text
        self.read = 0

    @property
    def pending(self) -> bool:
        return self.healing is not None

    def push(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        self._decode(final=False)

    def mark(self) -> tuple:
        """Where the decoder stands, for rewind: what the server's stop strings need to find the token that
        completed one within a step's several tokens."""
        return len(self.ids), self.text, self.prefix, self.read, self.healing

    def rewind(self, mark: tuple) -> None:
        """Back to where mark() found the decoder, as if the ids pushed since had never come."""
        count, self.text, self.prefix, self.read, self.healing = mark
        del self.ids[count:]

    def finish(self) -> None:
        """The end of the ids: a character left incomplete is decoded as it stands (U+FFFD), as a whole decode
        would show it."""
        self._decode(final=True)

    def _decode(self, final: bool) -> None:
        before = self.tokenizer.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
        if self.healing is not None:  # the first decoded text re-emits the removed text: cut it, once
            cut = self.healing.completion(self.text)
            if cut is not None or final:
                self.text = self.text if cut is None else cut
                self.healing = None
