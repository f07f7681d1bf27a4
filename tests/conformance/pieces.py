"""What a method needs beyond the target, built for one subject: keyed by the need the method declares
(conftest.declared_needs: a draft model, or a file option of its drafter), never by the method's name, so a new
method that needs one of these is tested as soon as it is registered, and one that needs something else fails the
suite naming the method and the need."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftverify.drafters import BlockwiseHeads, NatDecoder, NgramTable
from draftverify.drafters.bita_adapter import BitaAdapter, BitaConfig
from draftverify.drafters.blockwise import lm_head_fingerprint
from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head

from .conftest import DRAFT_MODEL, declared_needs

if TYPE_CHECKING:
    from .subjects import Subject


def ngram_table(subject: Subject, path: Path) -> Path:
    """A table that knows the prompt and the first half of the target's greedy text: some drafts are accepted."""
    text = subject.prompt + subject.greedy[: len(subject.greedy) // 2]
    vocab = subject.model.get_output_embeddings().weight.shape[0]
    NgramTable.from_sequences([text, list(range(vocab))], order=3, vocab_size=vocab).save(path)
    return path


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Every weight random (a fresh head's second layer starts at zero, which makes all heads propose alike)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * p.shape[-1] ** -0.5)


def blockwise_heads(subject: Subject, path: Path) -> Path:
    heads = BlockwiseHeads.for_target(subject.model, 4)
    _randomize(heads, seed=0)
    heads.save(path)
    return path


def bita_adapter(subject: Subject, path: Path) -> Path:
    """Random mask tokens and deep prompt for a decoder-only target; an encoder-decoder target has no decoder-only
    cache layout to read, so it gets a mask-only adapter (which loads, and the method then says whether it runs)."""
    model = subject.model
    torch.manual_seed(0)
    if model.config.is_encoder_decoder:
        hidden = model.get_input_embeddings().weight.shape[1]
        adapter = BitaAdapter(
            BitaConfig(3, 0, "none", hidden, 1, 1, 1, lm_head_fingerprint(model.get_output_embeddings()))
        )
    else:
        adapter = BitaAdapter.for_target(model, 3, "deep", 4)
    adapter.save(path)
    return path


def nat_drafter(subject: Subject, path: Path) -> Path:
    """An untrained NAT drafter sized for the target (over its encoder states or its own hidden states)."""
    torch.manual_seed(0)
    NatDecoder.for_target(subject.model, layers=1, block_size=4, ffn_size=64).save(path)
    return path


def eagle3_head(subject: Subject, path: Path) -> Path:
    """A random EAGLE-3 head sized for a decoder-only target (an encoder-decoder one gets a head sized for its
    decoder, which loads, and the method then says it does not run there)."""
    model = subject.model
    config = model.config.get_text_config(decoder=True) if model.config.is_encoder_decoder else model.config
    head = Eagle3Head(Eagle3Config.for_target(config, model.get_output_embeddings()))
    _randomize(head, seed=0)
    head.save(path)
    return path


FILE_BUILDERS: dict[str, Callable[[Subject, Path], Path]] = {
    "ngram_path": ngram_table,
    "heads_path": blockwise_heads,
    "bita_path": bita_adapter,
    "nat_path": nat_drafter,
    "eagle3_path": eagle3_head,
}


class MissingBuilder(AssertionError):
    """A registered method needs something this suite cannot build: a test failure, never a skip."""


def method_options(name: str, subject: Subject) -> dict[str, Any]:
    """The options that give method `name` everything it declares it needs on this subject."""
    options: dict[str, Any] = {}
    for need, what in declared_needs(name).items():
        if need == DRAFT_MODEL:
            options[need] = subject.draft
        elif need in FILE_BUILDERS:
            options[need] = subject.piece(need, FILE_BUILDERS[need])
        else:
            raise MissingBuilder(
                f"method {name!r} needs {need} ({what}), which the conformance suite cannot build: "
                "add a builder for it to tests/conformance/pieces.py FILE_BUILDERS"
            )
    return options
