"""Subjects: a target on one backend, with the references a method's output is held to there.

hf: every tiny test architecture (tests/conftest.py, float64 so greedy equality tests the algorithm, not
rounding) with a 96-token byte-level BPE as its tokenizer, so methods that move text between tokenizers run too;
the greedy reference is the target's own greedy decoding recomputed from scratch. llamacpp: a tiny random Llama on
the zoo's tokenizer, converted with llama.cpp's converter (skipped where llama-cpp-python or the converter is
missing, as tests/test_backend_llamacpp.py is); its references are our `autoregressive` method on that backend.
Either way the seeded reference is `autoregressive` with the same seed: coupled sampling gives the target's own
draw, whatever the method."""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import VOCAB, perturbed_copy, reference_greedy, save_llama, varied_model
from draftverify.api import Pipeline, load
from draftverify.backends.gguf import GGUF_CACHE_ENV, converter_available
from draftverify.errors import DraftVerifyError
from draftverify.methods import MethodOptions
from draftverify.types import GenerationOutput, SamplingParams
from tokenizer_pairs import TARGET_FILES, bpe_tokenizer

from .conftest import DRAFT_MODEL
from .pieces import method_options

NEW = 12  # new tokens per run
GAMMA = 4
ROOT = Path(__file__).resolve().parents[2]


class Refused(Exception):
    """The library refused the method on this subject (a DraftVerifyError before any token) and said why."""


class WithEos:
    """A tokenizer whose end-of-sequence id is another token: how a run is asked to stop at a chosen token."""

    def __init__(self, tokenizer, eos: int):
        self._tokenizer, self.eos_token_id = tokenizer, eos

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class Subject:
    backend: str
    arch: str
    model: Any  # the target as a Hugging Face model: what the pieces are built from
    prompt: list[int]
    refusals_allowed: bool  # may this subject refuse a method (encoder-decoder targets, backends other than hf)

    def __init__(self, folder: Path):
        self.folder = folder
        self._pieces: dict[str, Path] = {}
        self._pipelines: dict[str, Pipeline] = {}

    def __repr__(self) -> str:
        return f"{self.backend}/{self.arch}"

    @property
    def draft(self) -> Any:
        """The draft as this backend's pipeline takes it (draft_model)."""
        raise NotImplementedError

    @cached_property
    def greedy(self) -> list[int]:
        raise NotImplementedError

    def build(self, name: str, options: dict[str, Any]) -> Pipeline:
        raise NotImplementedError

    def piece(self, need: str, build: Callable[[Subject, Path], Path]) -> Path:
        if need not in self._pieces:
            self._pieces[need] = build(self, self.folder / need)
        return self._pieces[need]

    def pipeline(self, name: str, fresh: bool = False) -> Pipeline:
        if fresh or name not in self._pipelines:
            try:
                pipe = self.build(name, method_options(name, self))
            except DraftVerifyError as err:
                raise Refused(str(err)) from err
            if fresh:
                return pipe
            self._pipelines[name] = pipe
        return self._pipelines[name]

    def run(self, name: str, params: SamplingParams, eos: int | None = None) -> GenerationOutput:
        """Method `name` on the prompt; eos: stop at this token instead of the tokenizer's end of sequence."""
        pipe = self.pipeline(name, fresh=eos is not None)
        if eos is not None:
            pipe.tokenizer = WithEos(pipe.tokenizer, eos)
        emitted: list[torch.Tensor] = []
        try:
            output, _ = pipe.generate_ids(
                torch.tensor([self.prompt]), params, max_new_tokens=NEW, on_tokens=emitted.append
            )
        except DraftVerifyError as err:
            if emitted:  # a failure while decoding is a bug, not a refusal
                raise
            raise Refused(str(err)) from err
        return output

    def reference(self, params: SamplingParams) -> list[int]:
        if params.greedy:
            return self.greedy
        return self.run("autoregressive", params).new_tokens[0].tolist()


class HFSubject(Subject):
    backend = "hf"

    def __init__(self, arch: str, folder: Path):
        super().__init__(folder)
        self.arch = arch
        self.model = varied_model(arch)
        self.tokenizer = bpe_tokenizer(TARGET_FILES, VOCAB)
        self.prompt = [5, 17, 33, 8, 41, 5, 17]  # a repeated bigram: prompt lookup finds something
        self.refusals_allowed = bool(self.model.config.is_encoder_decoder)

    @cached_property
    def draft(self):
        return perturbed_copy(self.model, 0.2, seed=1)  # agrees with the target often, not always

    @cached_property
    def greedy(self) -> list[int]:
        return reference_greedy(self.model, torch.tensor([self.prompt]), NEW, eos=self.tokenizer.eos_token_id)

    def build(self, name: str, options: dict[str, Any]) -> Pipeline:
        return Pipeline(self.model, self.tokenizer, name, options=MethodOptions(**options), gamma=GAMMA)


def llamacpp_missing() -> str | None:
    """Why the llamacpp backend cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install -e '.[llamacpp]')"
    if not converter_available():
        return "no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
    return None


class LlamaCppSubject(Subject):
    backend = "llamacpp"
    arch = "llama"
    refusals_allowed = True  # the backend refuses what its declared capabilities lack (backends/base.py)

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer, LlamaForCausalLM

        super().__init__(folder)
        tokenizer = AutoTokenizer.from_pretrained(ROOT / "zoo" / "code" / "tokenizer")
        save_llama(folder / "target", layers=2, seed=0, tokenizer=tokenizer)
        self.model = LlamaForCausalLM.from_pretrained(folder / "target")
        draft = copy.deepcopy(self.model)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())  # agrees on about half the tokens
        draft.save_pretrained(folder / "draft")
        tokenizer.save_pretrained(folder / "draft")
        self.prompt = [5, 17, 99, 230, 7, 5, 17, 99, 230, 7, 5, 17]

    @property
    def draft(self) -> Path:
        return self.folder / "draft"

    @cached_property
    def greedy(self) -> list[int]:
        return self.run("autoregressive", SamplingParams()).new_tokens[0].tolist()

    def build(self, name: str, options: dict[str, Any]) -> Pipeline:
        files = dict(options)
        draft = files.pop(DRAFT_MODEL, None)
        # converted once: into $DRAFTVERIFY_GGUF_CACHE where it is set, else beside the models (never ~/.cache)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(GGUF_CACHE_ENV, os.environ.get(GGUF_CACHE_ENV) or str(self.folder / "gguf"))
            # the draft converts at f32 like the target; the default q8_0 draft is tests/test_backend_llamacpp.py's
            return load(
                target=self.folder / "target",
                draft=draft,
                method=name,
                backend="llamacpp",
                threads=1,
                gamma=GAMMA,
                draft_gguf="f32" if draft else None,
                **files,
            )
