"""Structured output through xgrammar (the `structured` extra): a `processing.Structured` compiled for one
tokenizer into a `Grammar`, whose matchers the loop's grammar processor walks along each draft
(engine/grammar.py). Compiled grammars are cached by xgrammar's compiler, one compiler per tokenizer."""

from __future__ import annotations

import json
import re
from functools import lru_cache

from .errors import DraftVerifyError
from .processing import ProcessingError, Structured

EXTRA = "pip install 'draftverify[structured]' (xgrammar)"


def require_xgrammar():
    """The xgrammar module, or a DraftVerifyError saying how to install it."""
    try:
        import xgrammar
    except ImportError:
        raise DraftVerifyError(f"structured output needs xgrammar: {EXTRA}") from None
    return xgrammar


class Grammar:
    """A compiled constraint for one tokenizer: new matchers (each at the start of the text) and the tokens that end
    the text once the grammar is complete."""

    def __init__(self, compiled, spec: Structured, stop_ids: tuple[int, ...], vocab_size: int):
        self.compiled = compiled
        self.spec = spec
        self.stop_ids = stop_ids
        self.vocab_size = vocab_size

    def matcher(self):
        return require_xgrammar().GrammarMatcher(self.compiled)

    def __repr__(self) -> str:
        return f"Grammar({self.spec.kind})"


def _message(err: Exception) -> str:
    """xgrammar's error without its log prefix ([time] /path/file.cc:line: ...)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", text)
    return re.sub(r"^Check failed: \([^)]*\) is false:\s*", "", text)


class GrammarCompiler:
    """Compiles `Structured` constraints for one tokenizer (a Hugging Face tokenizer) whose model has vocab_size
    logits; stop_ids: the tokens that end a text (the target's EOS), which a complete grammar allows."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]):
        xgr = require_xgrammar()
        if not stop_ids:
            raise DraftVerifyError("structured output needs the model's end-of-text token (its tokenizer has no EOS)")
        try:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        except Exception as err:  # a tokenizer xgrammar cannot read (a GGUF file's own vocabulary)
            raise DraftVerifyError(
                f"structured output needs the model's Hugging Face tokenizer; xgrammar cannot read this one "
                f"({type(tokenizer).__name__}: {_message(err)}): load the model from its folder"
            ) from None
        self.compiler = xgr.GrammarCompiler(info)
        self.stop_ids = tuple(stop_ids)
        self.vocab_size = vocab_size

    def compile(self, spec: Structured | Grammar) -> Grammar:
        """The compiled grammar of `spec` (a Grammar as it is); a constraint xgrammar refuses is a ProcessingError
        naming the field (json_schema, regex, grammar)."""
        if isinstance(spec, Grammar):
            return spec
        if not isinstance(spec, Structured):
            raise DraftVerifyError(f"structured must be a draftverify Structured, got {type(spec).__name__}")
        kind = spec.kind
        try:
            if kind == "json_schema":
                compiled = self.compiler.compile_json_schema(spec.json_schema, any_whitespace=spec.any_whitespace)
            elif kind == "json_object":
                compiled = self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=spec.any_whitespace)
            elif kind == "regex":
                compiled = self.compiler.compile_regex(spec.regex)
            elif kind == "grammar":
                compiled = self.compiler.compile_grammar(spec.grammar)
            else:  # choice: an alternation of string literals (JSON's escapes are EBNF's)
                assert spec.choice is not None  # the kind says so
                compiled = self.compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
        except Exception as err:  # xgrammar raises RuntimeError (and ValueError / TypeError for some inputs)
            raise ProcessingError(kind, f"{_message(err)}") from None
        return Grammar(compiled, spec, self.stop_ids, self.vocab_size)


@lru_cache(maxsize=8)
def compiler_for(tokenizer, vocab_size: int, stop_ids: tuple[int, ...]) -> GrammarCompiler:
    """One compiler per tokenizer (its cache holds the grammars it compiled)."""
    return GrammarCompiler(tokenizer, vocab_size, list(stop_ids))
