"""Log-probabilities in OpenAI's shapes: the loop's per-token entries (types.TokenLogprob, the target's own
distribution) matched to the text a request hands over, then written as completions' `logprobs` (tokens,
token_logprobs, top_logprobs, text_offset) or chat's (`content`: token, logprob, bytes, top_logprobs).

A token goes out with the text its first character is in (a streamed chunk, or the whole answer); a token whose
text starts past a stop string is not part of the answer and is dropped, as the text after the stop is. A token's
`token` is its own decoded text (as vLLM and llama-server write it; a byte-level token that ends inside a UTF-8
character reads U+FFFD there); `text_offset` is where its share of the answer's text starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..detokenize import IncrementalDecoder
from ..types import TokenLogprob

FLOOR = -9999.0  # a log-probability of -inf (a token the target rules out), as vLLM writes it: JSON has no infinity


@dataclass(frozen=True)
class Scored:
    """One token of an answer: its id, its log-probabilities (None for the prompt's first token, which nothing
    scores) and where its text starts in the answer's text."""

    token: int
    entry: TokenLogprob | None
    offset: int


class ScoredText:
    """A request's scored tokens, each waiting until the text it starts in is handed over (release). Offsets are
    counted in the generated text (an IncrementalDecoder fed one token at a time: where the text stood before the
    token) and handed out after `base` characters (the echoed prompt's)."""

    def __init__(self, tokenizer, base: int = 0):
        self.decoder = IncrementalDecoder(tokenizer)
        self.base = base
        self.waiting: list[Scored] = []

    def add(self, entries: list[TokenLogprob]) -> None:
        for entry in entries:
            offset = len(self.decoder.text)
            self.decoder.push([entry.token])
            self.waiting.append(Scored(entry.token, entry, offset))

    def release(self, sent: int | None) -> list[Scored]:
        """The tokens whose text starts within the first `sent` characters of the generated text (None: every
        token), in order, with their offsets in the whole answer; they are not handed out again."""
        count = len(self.waiting)
        if sent is not None:
            count = next((i for i, s in enumerate(self.waiting) if s.offset >= sent), count)
        out, self.waiting = self.waiting[:count], self.waiting[count:]
        return [Scored(s.token, s.entry, s.offset + self.base) for s in out]


def prompt_scored(tokenizer, ids: list[int], entries: list[TokenLogprob]) -> list[Scored]:
    """An echoed prompt's tokens: the first with no log-probability, then entries [len(ids) - 1] (each given the
    ones before it), offsets in the prompt's decoded text."""
    text = ScoredText(tokenizer)
    text.add([TokenLogprob(ids[0], 0.0)] + list(entries))
    first, *rest = text.release(None)
    return [Scored(first.token, None, first.offset), *rest]


def finite(value: float) -> float:
    return max(value, FLOOR)


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token])


def completion_logprobs(scored: list[Scored], tokenizer) -> dict:
    """Completions' logprobs object; top_logprobs lists the most likely tokens and the chosen one (as OpenAI: up
    to logprobs + 1 entries; tokens whose texts coincide share one key)."""
    tops: list[dict[str, float] | None] = []
    for s in scored:
        if s.entry is None:
            tops.append(None)
            continue
        top = {token_text(tokenizer, t): finite(v) for t, v in s.entry.top}
        top.setdefault(token_text(tokenizer, s.token), finite(s.entry.logprob))
        tops.append(top)
    return {
        "tokens": [token_text(tokenizer, s.token) for s in scored],
        "token_logprobs": [None if s.entry is None else finite(s.entry.logprob) for s in scored],
        "top_logprobs": tops,
        "text_offset": [s.offset for s in scored],
    }


def chat_logprobs(scored: list[Scored], tokenizer) -> dict:
    """Chat's logprobs object: per token its text, log-probability, UTF-8 bytes and the most likely tokens."""

    def described(token: int, value: float) -> dict:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": finite(value), "bytes": list(text.encode("utf-8"))}

    content = []
    for s in scored:
        assert s.entry is not None  # a chat answer's tokens are all generated, so all scored
        content.append(
            {**described(s.token, s.entry.logprob), "top_logprobs": [described(t, v) for t, v in s.entry.top]}
        )
    return {"content": content}
