"""llama.cpp as a peer (when llama-cpp-python is installed): the target converted to GGUF (gguf.py), decoded
plainly and with llama.cpp's prompt lookup, on the same token ids as every other row.

Greedy only: llama.cpp samples with its own random generator, so its sampled text cannot be compared with ours,
and its greedy text is compared with Hugging Face's in the "= baseline" column. Its rows are not marked lossless:
llama.cpp computes with its own kernels, so a near-tie may flip a token without any fault in the method.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter

import torch

from ..backends.gguf import gguf_for, llama_cpp_dir

# the target's GGUF weights have the bench's --target-gguf (else --dtype), and its attention our backend's kernels,
# as our rows run it
from ..backends.llamacpp import cpu_has_amx
from ..errors import DraftVerifyError
from .config import BenchConfig
from .models import BenchModels
from .runners import Measurement, Runner

PROMPT_LOOKUP_NGRAM = 3  # the same longest match as our prompt_lookup drafter and the HF row
INSTALL_HINT = "pip install 'draftverify[llamacpp]'"


class EvalCounter:
    """Counts llama.cpp evaluations (one decode call per batch of tokens) of one Llama object."""

    def __init__(self, llm):
        self.calls: list[int] = []  # tokens fed per call
        evaluate = llm.eval

        def counted(tokens):
            self.calls.append(len(tokens))
            return evaluate(tokens)

        llm.eval = counted

    def take(self) -> list[int]:
        calls, self.calls = self.calls, []
        return calls


@dataclass
class LlamaCppRunner(Runner):
    """Llama.generate at temperature 0, stopped at EOS or max_new_tokens; `lookup` set: prompt lookup drafts."""

    llm: object | None = None  # llama_cpp.Llama
    counter: EvalCounter | None = None
    lookup: object | None = None  # llama_cpp.llama_speculative.LlamaPromptLookupDecoding
    eos_token_id: int | None = None

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        if temperature > 0:
            raise DraftVerifyError("the llama.cpp rows run greedy only")
        self.llm.draft_model = self.lookup
        self.llm.reset()  # no prompt prefix reused from the previous call: every row prefills the whole prompt
        self.counter.take()
        new_ids: list[int] = []
        started = perf_counter()
        for token in self.llm.generate(
            input_ids[0].tolist(), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            new_ids.append(int(token))
            if len(new_ids) == max_new_tokens or token == self.eos_token_id:
                break
        seconds = perf_counter() - started
        calls = self.counter.take()
        # every llama.cpp evaluation emits >= 1 token (the prompt's emits the first), like HF's forwards
        return Measurement(
            new_ids=new_ids,
            seconds=seconds,
            target_calls=len(calls),
            draft_calls=0,
            drafted=sum(n - 1 for n in calls[1:]),
            accepted=0,
            rejections=0,
        )


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


@contextmanager
def _default_model_params_without_extra_buffers():
    """llama-cpp-python's Llama() takes no use_extra_bufts: for its call, the default model parameters it reads
    are wrapped to switch them off on an AMX CPU, where llama.cpp's AMX matmul crashes on q8_0 weights (a q8_0
    target, --target-gguf q8_0) and our backend keeps every weight in plain CPU buffers (GGUFModel)."""
    import llama_cpp.llama as high_level

    low_level = high_level.llama_cpp
    default = low_level.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = not cpu_has_amx()
        return p

    low_level.llama_model_default_params = params
    try:
        yield
    finally:
        low_level.llama_model_default_params = default


def plain_buffers_llama(**kwargs):
    """A llama_cpp.Llama whose weights sit where our backend's sit (see the context manager above)."""
    from llama_cpp import Llama

    with _default_model_params_without_extra_buffers():
        return Llama(**kwargs)


def llamacpp_runners(config: BenchConfig, models: BenchModels) -> tuple[list[Runner], list[str]]:
    """The llama.cpp rows (plain; prompt lookup at each fixed gamma), or none and a note saying why."""
    families = [f for f in ("llamacpp", "llamacpp_prompt_lookup", "llamacpp_draft") if config.wants(f)]
    if not families:
        return [], []
    if config.device != "cpu":  # this llama-cpp-python is CPU-only: no row to compare with models on a GPU
        return [], [f"llama.cpp rows skipped: llama.cpp runs on the CPU here, the models on {config.device}"]
    if not installed():
        return [], [f"llama.cpp rows skipped: llama-cpp-python is not installed ({INSTALL_HINT})"]
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    try:
        source = llama_cpp_dir()
        outtype = config.target_gguf_type()
        gguf = gguf_for(models.paths["target"], outtype, source)  # converted once, cached: shared with the backend
    except DraftVerifyError as err:
        return [], [f"llama.cpp rows skipped: {err}"]
    threads = config.threads or torch.get_num_threads()
    n_ctx = models.context_limit or 4096
    common = dict(
        n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=config.llamacpp_flash_attn(), verbose=False
    )
    shared = dict(
        family="llamacpp",
        greedy_only=True,
        lossless=False,
        eos_token_id=models.eos_token_id,
        settings={"gguf": outtype, "threads": threads},
    )
    runners: list[Runner] = []
    if "llamacpp" in families:
        plain = plain_buffers_llama(model_path=str(gguf), **common)
        runners.append(LlamaCppRunner("llamacpp", llm=plain, counter=EvalCounter(plain), **shared))
    fixed = [g for g in config.gammas if isinstance(g, int)]
    if "llamacpp_prompt_lookup" in families:
        # one model for every lookup row: with a draft model llama-cpp-python keeps the logits of every position.
        # Each fixed gamma with our drafter's longest match, and llama-cpp-python's own defaults as they ship
        # (LlamaPromptLookupDecoding(): 2-gram matches, 10 tokens), as the hf_assisted rows keep transformers'
        lookups = [
            (f"g={g}", g, LlamaPromptLookupDecoding(max_ngram_size=PROMPT_LOOKUP_NGRAM, num_pred_tokens=g))
            for g in fixed
        ] + [("default", "default", LlamaPromptLookupDecoding())]
        lookup_llm = plain_buffers_llama(model_path=str(gguf), draft_model=lookups[0][2], **common)
        counter = EvalCounter(lookup_llm)
        for label, gamma, lookup in lookups:
            runners.append(
                LlamaCppRunner(
                    f"llamacpp_prompt_lookup[{label}]",
                    gamma=gamma,
                    llm=lookup_llm,
                    counter=counter,
                    lookup=lookup,
                    **{
                        **shared,
                        "family": "llamacpp_prompt_lookup",
                        "settings": {
                            **shared["settings"],
                            "max_ngram_size": lookup.max_ngram_size,
                            "num_pred_tokens": lookup.num_pred_tokens,
                        },
                    },
                )
            )
    notes = [
        f"llama.cpp rows: the target converted to GGUF ({outtype}, {gguf}) with {source / 'convert_hf_to_gguf.py'}; "
        "greedy only, compared with hf_generate token for token"
    ]
    if "llamacpp_draft" in families and fixed:
        if not models.paths.get("draft"):
            notes.append("llamacpp_draft skipped: no draft model")
            return runners, notes
        try:
            draft_gguf = gguf_for(models.paths["draft"], config.draft_gguf, source)  # the draft our llama.cpp rows use
        except DraftVerifyError as err:
            notes.append(f"llamacpp_draft skipped: {err}")
            return runners, notes
        from ..backends.llamacpp import GGUFModel

        draft_model = GGUFModel(draft_gguf)
        first = GGUFDraftModel(draft_model, fixed[0], threads, config.llamacpp_flash_attn())
        draft_llm = plain_buffers_llama(model_path=str(gguf), draft_model=first, **common)
        counter = EvalCounter(draft_llm)
        for g in fixed:
            runners.append(
                LlamaCppRunner(
                    f"llamacpp_draft[g={g}]",
                    gamma=g,
                    llm=draft_llm,
                    counter=counter,
                    lookup=first
                    if g == fixed[0]
                    else GGUFDraftModel(draft_model, g, threads, config.llamacpp_flash_attn()),
                    **{
                        **shared,
                        "family": "llamacpp_draft",
                        "settings": {**shared["settings"], "draft": draft_gguf.name},
                    },
                )
            )
        notes.append(
            "llamacpp_draft rows: llama-cpp-python's own speculative decoding (Llama(draft_model=...)) with "
            "the draft model's GGUF drafting g greedy tokens on a llama.cpp context of its own"
        )
    return runners, notes


def GGUFDraftModel(model, num_pred_tokens: int, threads: int, flash_attn: bool):
    """A llama_cpp LlamaDraftModel: the draft GGUF drafts num_pred_tokens greedy tokens per call, on a llama.cpp
    context of its own that keeps the text it has seen (the llamacpp backend's LlamaCppLM) and drops its drafts."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel

    from ..backends.llamacpp import LlamaCppLM

    class _Draft(LlamaDraftModel):
        def __init__(self):
            self.lm = LlamaCppLM(model, role="draft", threads=threads, flash_attn=flash_attn)
            self.seen: list[int] = []  # the tokens in the draft's cache (committed)

        def __call__(self, input_ids, /, **kwargs):
            ids = [int(t) for t in input_ids]
            if not ids:
                return np.array([], dtype=np.intc)
            if len(self.seen) < len(ids) and ids[: len(self.seen)] == self.seen:
                pending = ids[len(self.seen) :]
            else:  # another text (a new prompt, or a rejection before what it has seen): start again
                self.lm.check_fits(len(ids) + num_pred_tokens)
                self.lm.start(torch.tensor([ids]))
                self.seen, pending = ids[:-1], ids[-1:]
            logits = self.lm.forward(torch.tensor([pending]), logits_to_keep=1).logits[0, -1]
            self.lm.commit(len(pending))
            self.seen += pending
            drafted: list[int] = []
            for i in range(num_pred_tokens):
                drafted.append(int(logits.argmax()))
                if i + 1 < num_pred_tokens:
                    logits = self.lm.forward(torch.tensor([[drafted[-1]]])).logits[0, -1]
            self.lm.commit(0)  # the drafts leave the cache; accepted ones come back as input next call
            return np.array(drafted, dtype=np.intc)

    return _Draft()
