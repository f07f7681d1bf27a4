"""The convenience layer: load models by path, pick a method by name, generate from text.

pipe = draftverify.load(target="path/to/target", draft="path/to/draft", method="model")
result = pipe.generate("def quicksort(xs):", max_new_tokens=64)
print(result.text, result.stats.tokens_per_call)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel

from . import compiling, devices
from .backends.hf.cached_lm import cached_model
from .checks import check_prompt_text
from .detokenize import IncrementalDecoder
from .draft_length import DEFAULT_GAMMA, DraftLength, KeptPolicies, StepCosts, make_draft_length
from .errors import DraftVerifyError
from .healing import Healing, TokenTable
from .hub import hub_unreachable_reason
from .loop import generate
from .methods import MethodOptions, build_drafter, build_verifier, resolve_method
from .options import check_files, check_names, fill_from_zoo
from .options.checks import check_zoo_ships
from .processing import Processing
from .quiet import quiet
from .sampling import row_params
from .types import GenerationOutput, GenerationStats, Logprobs, SamplingParams, left_padded
from .zoo import zoo_folder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def zoo_paths(name: str) -> dict[str, Path]:
    """The models of zoo entry `name`; the files its drafters read are declared with their options (options/)."""
    folder = zoo_folder(name)
    return {"target": folder / "target", "draft": folder / "draft", "draft_aligned": folder / "draft-aligned"}


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
    "source.spm",
)


def _hub_access(path: str) -> tuple[dict, str | None]:
    """(from_pretrained options, why the hub is unreachable or None) for `path`: nothing for a local folder;
    for a hub id, local_files_only when the hub cannot be reached, so an offline machine answers at once from
    the cache (or with a clear error) instead of retrying the network for half a minute."""
    if Path(path).exists():
        return {}, None
    reason = hub_unreachable_reason()
    return ({}, None) if reason is None else ({"local_files_only": True}, reason)


def _not_found(path: str, role: str, offline_reason: str | None, err: Exception) -> DraftVerifyError:
    if offline_reason is not None:
        return DraftVerifyError(
            f"could not load the {role} model {path!r}: it is not a local folder, the Hugging Face hub cannot be "
            f"reached ({offline_reason}) and it is not in the local cache; pass a local model folder, or download "
            "it once while online"
        )
    where = "the local directory does not exist and " if not Path(path).exists() else ""
    return DraftVerifyError(
        f"could not load the {role} model {path!r}: {where}it is not a Hugging Face model "
        f"(no usable config.json) or the hub cannot be reached ({type(err).__name__})"
    )


def load_model(
    path: str | Path,
    dtype: str = "float32",
    role: str = "target",
    verbose: bool | None = None,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """A causal LM or encoder-decoder from a local directory (or the hub, when it can be reached), on `device` (a
    checked torch.device or string: devices.py). Quiet unless verbose (or DRAFTVERIFY_VERBOSE=1): no progress bars
    or advice from transformers (see quiet.py)."""
    if dtype not in DTYPES:
        raise DraftVerifyError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = str(path)
    hub, offline_reason = _hub_access(path)
    with quiet(verbose):
        try:
            config = AutoConfig.from_pretrained(path, **hub)
        except (OSError, ValueError) as err:
            raise _not_found(path, role, offline_reason, err) from err
        cls = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        try:
            return cls.from_pretrained(path, dtype=DTYPES[dtype], **hub).to(device).eval()
        except (OSError, ValueError) as err:
            raise DraftVerifyError(f"could not load the {role} model weights from {path!r}: {err}") from err


def has_tokenizer_files(path: str | Path) -> bool:
    """False for a local folder without any tokenizer file; True otherwise (a hub id is asked when loading)."""
    folder = Path(path)
    return not folder.is_dir() or any((folder / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(path: str | Path, verbose: bool | None = None, role: str = "target"):
    """A model's tokenizer, which must live beside it (as save_pretrained writes it); quiet unless verbose."""
    path = str(path)
    folder = Path(path)
    if not has_tokenizer_files(path):
        raise DraftVerifyError(
            f"the {role} model folder {path!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): save "
            "the tokenizer beside the model with tokenizer.save_pretrained(folder)"
        )
    hub, offline_reason = _hub_access(path)
    try:
        with quiet(verbose):
            return AutoTokenizer.from_pretrained(path, **hub)
    except Exception as err:  # transformers raises OSError, ValueError, ImportError, ... with misleading hints
        if not folder.exists():
            raise _not_found(path, role, offline_reason, err) from err
        raise DraftVerifyError(
            f"could not load a tokenizer from {path!r}: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}"
        ) from err


def output_width(model) -> int:
    """Logits per position of a Hugging Face model (its vocabulary as the LM head sees it)."""
    return int(model.get_output_embeddings().weight.shape[0])


def same_vocabulary(a, b) -> bool:
    """Two tokenizers give every token string the same id (what a draft's ids must mean to the target)."""
    return a is b or a.get_vocab() == b.get_vocab()


def draft_tokenizer_for(path: str | Path, draft_model, target_tokenizer, target_model, verbose: bool | None = None):
    """The draft's own tokenizer when the draft cannot share the target's vocabulary (the `model` method then
    re-tokenizes its text: cross_tokenizer), or None when it shares it. A draft folder without tokenizer files
    shares it when its logits are as wide as the target's (as before), and is refused otherwise."""
    draft_width, target_width = output_width(draft_model), output_width(target_model)
    if not has_tokenizer_files(path):
        if draft_width == target_width:
            return None
        raise DraftVerifyError(
            f"the draft {str(path)!r} has another vocabulary than the target ({draft_width} vs {target_width} output "
            "logits) and no tokenizer files to translate between them: save the draft's tokenizer beside it "
            "(tokenizer.save_pretrained(folder)), or use a draft trained with the target's tokenizer"
        )
    draft_tokenizer = load_tokenizer(path, verbose, role="draft")
    if draft_width == target_width and same_vocabulary(draft_tokenizer, target_tokenizer):
        return None
    return draft_tokenizer


@dataclass
class GenerationResult:
    text: str
    output: GenerationOutput
    verifier: str  # the rule that ran ("exact" resolves per call: greedy, gumbel_coupling or speculative_sampling)

    @property
    def stats(self) -> GenerationStats:
        return self.output.stats


class Pipeline:
    """A target, a method and its pieces, ready to turn text into text plus statistics."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer,
        method: str = "model",
        verifier: str | None = None,
        options: MethodOptions | None = None,
        gamma: int | str = DEFAULT_GAMMA,
        compile: bool = False,
        heal: bool = False,
    ):
        """compile: preallocate the target's KV cache (its context length, else 4096 positions) and compile its
        forward for the verify widths this method and gamma use (compiling.py); options.compile does the same for
        a draft model. The first generation pays the compilation, unless precompile() ran first. heal: token
        healing by default in generate() (healing.py); off by default, so the text is the target's plain
        greedy decoding of the prompt as tokenized."""
        self.method = resolve_method(method)
        self.verifier_name = verifier or self.method.verifier
        self.target = cached_model(target, "target", compile)  # a HF model, or any backend (backends/base.py)
        self.tokenizer = tokenizer
        self.options = options or MethodOptions()
        if self.options.target_tokenizer is None:  # a draft with its own tokenizer translates to this one
            self.options = self.options.replace(target_tokenizer=tokenizer)
        from . import drafters  # noqa: F401  (fills the registry)
        from .backends.base import check_backend
        from .registry import DRAFTERS, lookup

        check_backend(self.target, lookup(DRAFTERS, "drafter", self.method.drafter), method)
        self.drafter = build_drafter(self.method.drafter, self.target, self.options)
        self.gamma = gamma
        make_draft_length(gamma, context=self.target.max_positions)  # validate now, not at the first call
        self.step_costs = StepCosts()  # gamma auto's timings, kept across calls: calibrated once per pipeline
        # auto / conf, kept across calls, starting from the target's measured cost curve where it has one (llama.cpp)
        self.policies = KeptPolicies(
            self.step_costs,
            self.target.max_positions,
            getattr(self.target, "cost_curve", None),
            self.drafter.longest_draft,
        )
        self.compiled = compiling.plan(self.target, self.drafter, gamma)  # the compiled models (none: eager)
        self.heal = self.check_heal(heal)
        self._token_table: TokenTable | None = None  # built at the first healing, then kept

    def precompile(self, text: str, max_new_tokens: int, log: Callable[[str], None] | None = None) -> float:
        """Compile every graph a generation of max_new_tokens after `text` uses, now (log gets a line per graph);
        returns the seconds. Without it the first generation compiles them as it reaches each width."""
        ids = self.encode(text)
        positions = (1 if self.target.is_encoder_decoder else ids.shape[1]) + max_new_tokens
        return compiling.precompile(self.target, self.drafter, ids, positions, log)

    def check_heal(self, heal) -> bool:
        """heal, if this pipeline can heal as asked (a bool; healing needs a target that continues its prompt)."""
        if not isinstance(heal, bool):
            raise DraftVerifyError(f"heal must be True or False, got {heal!r}")
        if heal and self.target.is_encoder_decoder:
            raise DraftVerifyError(
                "token healing continues a prompt; an encoder-decoder target does not continue "
                "its source (translate without heal)"
            )
        return heal

    @property
    def token_table(self) -> TokenTable:
        """Every token's bytes, sorted for prefix look-ups (built once per pipeline)."""
        if self._token_table is None:
            self._token_table = TokenTable(self.tokenizer, self.target.vocab_size)
        return self._token_table

    def heal_ids(self, ids: list[int]) -> Healing | None:
        """Token healing of a prompt's ids: the backed-up prompt and the first token's allowed set, or None when
        healing changes nothing (see healing.py)."""
        return self.token_table.heal(ids)

    def encode(self, text: str) -> torch.Tensor:
        text = check_prompt_text(text)
        ids = self.tokenizer(text, return_tensors="pt").input_ids  # [1, L]
        if ids.shape[1] == 0:
            raise DraftVerifyError(f"the prompt {text!r} tokenizes to no tokens")
        return ids

    def generate(
        self,
        text: str | list[str],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None | list[int | None] = None,
        gamma: int | str | DraftLength | None = None,
        on_text: Callable[[str], None] | None = None,
        coupling: bool | None = None,
        heal: bool | None = None,
        processing: Processing | list[Processing | None] | None = None,
    ) -> GenerationResult | list[GenerationResult]:
        """coupling (default: on when seeded) samples with position-keyed noise: the same seed then gives the
        same text for every method and draft length. Nothing is streamed before every check has passed.

        processing: penalties, logit_bias, min_tokens, ignore_eos, stop_token_ids and structured output
        (draftverify.Processing, draftverify.Structured; one for every text, or one per text): the text is the
        target's own decoding under them, whatever the method (a structured constraint is compiled for this
        pipeline's tokenizer first; the `structured` extra).

        heal (default: the pipeline's `heal`): token healing. The prompt is backed up over its last token and the
        first new token must start with that token's text; the result is the target's own decoding of the
        backed-up prompt under that constraint, and `text` (and what on_text streams) is relative to the ORIGINAL
        prompt, so prompt + text reads on. stats count the tokens the model saw and made: one prompt token fewer,
        and the healed token among the new ones (it counts against max_new_tokens).

        A list of texts runs as one batch through the decoding loop and returns one result per text (their
        stats are the batch's); seed may then be one per text: each row's text equals its own batch-1 text at
        temperature 0 and with coupled (seeded) sampling. Batches need a method that batches (every one but bpd_neural,
        specdec*, bild*, specdec++ and a draft with its own tokenizer) and a decoder-only target; on_text is for single
        texts."""
        heal = self.heal if heal is None else self.check_heal(heal)
        if isinstance(text, (list, tuple)):
            return self._generate_texts(
                list(text), max_new_tokens, temperature, top_k, top_p, seed, gamma, coupling, on_text, heal, processing
            )
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, coupling=coupling)
        ids = self.encode(text)
        healing = self.heal_ids(ids[0].tolist()) if heal else None
        if healing is not None:
            ids = torch.tensor([healing.ids])
        streamer = _TextStreamer(self.tokenizer, on_text, healing) if on_text else None
        output, verifier = self.generate_ids(
            ids,
            params,
            max_new_tokens=max_new_tokens,
            gamma=gamma,
            on_tokens=streamer.push if streamer else None,
            first_token_allowed=None if healing is None else healing.allowed,
            processing=processing,
        )
        if streamer is not None:
            streamer.finish()
        return GenerationResult(
            text=self.decode_new(output.new_tokens[0].tolist(), healing), output=output, verifier=verifier
        )

    def decode_new(self, new_ids: list[int], healing: Healing | None = None) -> str:
        """The text of new token ids after the prompt; with healing, after the ORIGINAL prompt (the removed text
        that the first new token re-emits is cut from the front)."""
        text = self.tokenizer.decode([t for t in new_ids if t >= 0], skip_special_tokens=True)
        if healing is None:
            return text
        cut = healing.completion(text)
        return text if cut is None else cut

    @property
    def eos_token_id(self) -> int | list[int] | None:
        if self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        return getattr(getattr(self.target, "config", None), "eos_token_id", None)

    @property
    def supports_batches(self) -> bool:
        """Whether this pipeline's method decodes batches of several rows (a drafter and verifier that batch, on
        growing caches: compiled models preallocate one row)."""
        from .backends.base import check_backend
        from .methods import build_verifier as _build

        try:
            check_backend(self.target, type(self.drafter), self.method.name, batched=True)  # trees on llama.cpp
        except DraftVerifyError:
            return False
        return (
            self.drafter.supports_batch
            and not self.compiled
            and _build(self.verifier_name, SamplingParams(), self.options).supports_batch
        )

    @property
    def mixes_sampling(self) -> bool:
        """Whether one batch may hold rows with different sampling settings (the verifier judges rows apart)."""
        from .methods import build_verifier as _build

        return _build(self.verifier_name, SamplingParams(), self.options).per_row_params

    def generate_ids(
        self,
        ids: torch.Tensor,
        params: SamplingParams,
        max_new_tokens: int = 64,
        gamma: int | str | DraftLength | None = None,
        on_tokens=None,
        first_token_allowed: torch.Tensor | None = None,
        on_step=None,
        logprobs: Logprobs | None = None,
        processing: Processing | list[Processing | None] | None = None,
    ) -> tuple[GenerationOutput, str]:
        """Token ids in, GenerationOutput and the verifier's name out (the server's entry point): ids [1, L];
        on_tokens receives each step's emitted tokens [1, k]; first_token_allowed [K] constrains the first new
        token (token healing; see loop.generate); on_step receives each step's record (loop.generate); logprobs:
        the log-probabilities to report (types.Logprobs; GenerationOutput.logprobs and each step's record);
        processing: the logits processing (draftverify.Processing; its structured output compiled here)."""
        return self._run(
            ids,
            params,
            gamma,
            max_new_tokens=max_new_tokens,
            on_tokens=on_tokens,
            first_token_allowed=first_token_allowed,
            on_step=on_step,
            logprobs=logprobs,
            processing=processing,
        )

    @property
    def grammar_compiler(self):
        """The structured-output compiler for this pipeline's tokenizer and target (structured.py; xgrammar, the
        `structured` extra), made at the first use and shared by every pipeline on the same tokenizer."""
        from .structured import compiler_for

        eos = self.eos_token_id
        stops = (eos,) if isinstance(eos, int) else tuple(eos or ())
        return compiler_for(self.tokenizer, self.target.vocab_size, stops)

    def compile_processing(self, processing: Processing | list | None):
        """processing with its structured constraint compiled for this pipeline (each entry of a list)."""
        if isinstance(processing, (list, tuple)):
            return [self.compile_processing(p) for p in processing]
        if not isinstance(processing, Processing) or processing.structured is None:
            return processing  # None, or what loop.generate will refuse by name
        return replace(processing, structured=self.grammar_compiler.compile(processing.structured))

    def _run(self, ids: torch.Tensor, params, gamma, **loop_options) -> tuple[GenerationOutput, str]:
        """ids [B, L] through loop.generate with this pipeline's target, drafter, EOS and draft-length policy for
        gamma (None: the pipeline's), judged by a verifier built for params; loop_options go to generate as they
        are, save processing, whose structured output is compiled first. Returns the output and the verifier's
        name."""
        if loop_options.get("processing") is not None:
            loop_options["processing"] = self.compile_processing(loop_options["processing"])
        verifier = build_verifier(self.verifier_name, params, self.options)
        policy = self.policies.get(self.gamma if gamma is None else gamma, getattr(params, "temperature", None))
        output = generate(
            self.target,
            self.drafter,
            verifier,
            ids,
            params,
            gamma=policy,
            eos_token_id=self.eos_token_id,
            **loop_options,
        )
        return output, verifier.name

    def _generate_texts(
        self,
        texts: list[str],
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        gamma,
        coupling,
        on_text,
        heal: bool = False,
        processing=None,
    ) -> list[GenerationResult]:
        if not texts:
            raise DraftVerifyError("the list of prompts is empty")
        if on_text is not None:
            raise DraftVerifyError(
                "on_text streams one text; for a batch of prompts use generate_batch_ids(on_tokens=...)"
            )
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(texts)
        if len(seeds) != len(texts):
            raise DraftVerifyError(f"{len(seeds)} seeds for {len(texts)} prompts")
        for s in seeds:
            SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=s, coupling=coupling)
        first = next((s for s in seeds if s is not None), None)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=first, coupling=coupling)
        if params.coupled and any(s is None for s in seeds) and any(s is not None for s in seeds):
            raise DraftVerifyError("give a seed for every prompt or for none: seeded rows sample with coupled noise")
        rows = [self.encode(t)[0].tolist() for t in texts]
        healings = [self.heal_ids(r) if heal else None for r in rows]
        rows = [r if h is None else h.ids for r, h in zip(rows, healings)]
        allowed = [None if h is None else h.allowed for h in healings] if any(healings) else None
        output, verifier = self.generate_batch_ids(
            rows,
            params,
            max_new_tokens=max_new_tokens,
            seeds=seeds,
            gamma=gamma,
            first_token_allowed=allowed,
            processing=processing,
        )
        new_rows = output.rows if output.rows is not None else [output.new_tokens[0].tolist()]
        return [
            GenerationResult(text=self.decode_new(r, h), output=output, verifier=verifier)
            for r, h in zip(new_rows, healings)
        ]

    def generate_batch_ids(
        self,
        rows: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        max_new_tokens: int | list[int] = 64,
        seeds: list[int | None] | None = None,
        gamma: int | str | DraftLength | None = None,
        on_tokens=None,
        admit=None,
        first_token_allowed: list[torch.Tensor | None] | None = None,
        on_step=None,
        logprobs: list[Logprobs | None] | None = None,
        processing: Processing | list[Processing | None] | None = None,
    ) -> tuple[GenerationOutput, str]:
        """Several token-id prompts through the loop at once (left-padded, one row each); one row runs the
        batch-1 path unless admit is given. on_tokens receives [B, k] (-1 padded) and may return rows to stop;
        admit lets rows join between steps (continuous batching: it returns a list of RowRequest);
        first_token_allowed: each row's allowed first tokens or None (token healing). params: one setting for all
        rows, or one per row (each row drafted and judged by its own temperature / top-k / top-p / seed). on_step
        receives each step's record and the rows it describes (loop.generate: the server's per-request usage);
        logprobs: each row's log-probabilities to report (types.Logprobs or None), or None for none; processing:
        one draftverify.Processing for every row, or one per row (None: none)."""
        if not rows or any(not r for r in rows):
            raise DraftVerifyError("every prompt needs at least one token")
        if isinstance(params, (list, tuple)):
            if len(params) != len(rows):
                raise DraftVerifyError(f"{len(params)} sampling settings for {len(rows)} prompts")
            wrong = next((p for p in params if not isinstance(p, SamplingParams)), None)
            if wrong is not None:
                raise DraftVerifyError(
                    f"each row's sampling settings must be a SamplingParams, got {type(wrong).__name__} {wrong!r}"
                )
            if seeds is None:
                seeds = [p.seed for p in params]
            params = row_params(params)
        if len(rows) == 1 and admit is None:  # the batch-1 path (generate_ids): one row's own settings, no padding
            if seeds is not None and seeds[0] != params.seed:
                params = replace(params, seed=seeds[0])
            ids, batch = torch.tensor([rows[0]]), {}
            max_new_tokens = max_new_tokens[0] if isinstance(max_new_tokens, (list, tuple)) else max_new_tokens
            first_token_allowed = None if first_token_allowed is None else first_token_allowed[0]
            logprobs = None if logprobs is None else logprobs[0]  # type: ignore[assignment]
            processing = _first(processing, len(rows))
        else:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ids, mask = left_padded(rows, pad)
            batch = dict(attention_mask=mask, seeds=seeds, admit=admit)
        return self._run(
            ids,
            params,
            gamma,
            max_new_tokens=max_new_tokens,
            on_tokens=on_tokens,
            first_token_allowed=first_token_allowed,
            on_step=on_step,
            logprobs=logprobs,
            processing=processing,
            **batch,
        )


def _first(processing, rows: int):
    """A one-row batch's processing: the one given, or the first of a list (of as many as there are rows)."""
    if isinstance(processing, (list, tuple)):
        if len(processing) != rows:
            raise DraftVerifyError(f"processing has {len(processing)} entries for {rows} rows")
        return processing[0]
    return processing


class _TextStreamer:
    """Forwards the new, complete characters of the growing output after each step, decoding only the ids since
    the last boundary (detokenize.IncrementalDecoder); with healing, only the text after the original prompt (the
    removed text is not sent again)."""

    def __init__(self, tokenizer, on_text: Callable[[str], None], healing: Healing | None = None):
        self.decoder = IncrementalDecoder(tokenizer, healing)
        self.on_text = on_text
        self.printed = 0

    def push(self, tokens: torch.Tensor) -> None:
        """tokens [1, k]: the step's emitted ids."""
        self.decoder.push(tokens[0].tolist())
        self._send()

    def finish(self) -> None:
        """After the last step: what was held back (an incomplete character) goes out as the whole decode has it."""
        self.decoder.finish()
        self._send()

    def _send(self) -> None:
        if self.decoder.pending or len(self.decoder.text) == self.printed:
            return
        self.on_text(self.decoder.text[self.printed :])
        self.printed = len(self.decoder.text)


def load(
    target: str | Path | None = None,
    draft: str | Path | None = None,
    method: str = "model",
    verifier: str | None = None,
    zoo: str | None = None,
    dtype: str = "auto",
    gamma: int | str = DEFAULT_GAMMA,
    compile: bool = False,
    heal: bool = False,
    verbose: bool | None = None,
    backend: str = "hf",
    threads: int | None = None,
    draft_gguf: str | None = None,
    device: str = "cpu",
    target_gguf: str | None = None,
    flash_attn: bool | None = None,
    **options,
) -> Pipeline:
    """Load a target (and draft) by path or zoo name and return a Pipeline for `method`.

    Prints nothing: transformers' weight-loading bars and advice are off while it loads (and the settings found
    are put back afterwards); verbose=True, or DRAFTVERIFY_VERBOSE=1, shows them.

    device: cpu, cuda, cuda:N or mps; the target and draft load there, and everything the method builds (KV caches,
    heads, adapters, the NAT drafter, trees, sampling generators) follows the target. A device this machine lacks is
    a DraftVerifyError naming the ones it has. dtype: auto (float32 on cpu, bfloat16 on a CUDA GPU that supports it
    else float16, float16 on mps), float32, bfloat16 or float16.

    heal: token healing by default in this pipeline's generate() (healing.py); off unless asked, so the text is
    the target's plain decoding of the prompt as tokenized (what a peer that does not heal produces).

    backend: a name in the backend registry (backends/registry.py): "hf" (Hugging Face transformers) or
    "llamacpp" (llama.cpp through llama-cpp-python, the `llamacpp` extra: a `.gguf` path as it is, a model folder
    converted to GGUF at `dtype` on first use and cached; the draft model runs on llama.cpp as well; threads: its
    CPU threads, default torch's; draft_gguf: the GGUF type a draft folder is converted at,
    backends.DRAFT_GGUF_TYPES, default q8_0: a draft's precision changes what it proposes, never the output;
    target_gguf: the GGUF type a target folder is converted at, default dtype's: q8_0, q4_k_m, q4_0, q5_k_m or q6_k
    as llama.cpp users run their models, the output then that file's own greedy text; flash_attn: llama.cpp's flash
    attention, on by default as llama.cpp runs it, or off; neither makes llama.cpp's CPU kernels give a several-token
    verify pass the bits of one-token decoding on every input, docs/backends.md).

    options are the declared method options (draftverify.options: each drafter's own, e.g. nat_path, and the
    shared ones: alpha_fb, alpha_rb, lenience, beta, tau); an unknown name is a DraftVerifyError. With zoo, the
    entry's files fill the file options not given (e.g. its nat/ folder fills nat_path).
    """
    from .backends.registry import target_backend

    entry = target_backend(backend)
    check_names(options)
    check_files(options)
    if zoo is not None:
        options = fill_from_zoo(options, zoo_folder(zoo))
        check_zoo_ships(zoo, method, options)
        paths = zoo_paths(zoo)
        target = target or paths["target"]
        if draft is None and resolve_method(method).needs_draft:
            draft = paths["draft"]
    if target is None:
        raise DraftVerifyError("no target model: pass target=PATH or zoo=NAME")
    resolve_method(method)
    make_draft_length(gamma)  # bad arguments fail before anything is loaded
    if not isinstance(heal, bool):
        raise DraftVerifyError(f"heal must be True or False, got {heal!r}")
    device, dtype = devices.resolve(device, dtype)
    if device.type != "cpu" and not entry.gpu:
        raise DraftVerifyError(
            f"the {entry.name} backend runs on the CPU only (the llama-cpp-python here has no GPU backend): use "
            "--device cpu, or --backend hf on a GPU"
        )
    if flash_attn is not None and not isinstance(flash_attn, bool):
        raise DraftVerifyError(f"flash_attn must be True or False, got {flash_attn!r}")
    given = {"draft_gguf": draft_gguf, "target_gguf": target_gguf, "flash_attn": flash_attn}
    backend_options = {name: value for name, value in given.items() if value is not None}
    for name in backend_options:
        if name not in entry.own_options:
            raise DraftVerifyError(f"{name} ({BACKEND_OPTION_FLAGS[name]}) {not_on_backend(name, entry.name)}")
    return entry.load(
        target,
        draft,
        method,
        verifier,
        dtype,
        gamma,
        compile,
        threads,
        options,
        verbose,
        heal,
        device,
        **backend_options,
    )


# the load() options only some backends read (BackendEntry.own_options), by their CLI flags
BACKEND_OPTION_FLAGS = {
    "draft_gguf": "--draft-gguf",
    "target_gguf": "--target-gguf",
    "flash_attn": "--flash-attn/--no-flash-attn",
}


def not_on_backend(name: str, backend: str) -> str:
    """Why a backend-only option does not apply on `backend` (the rest of a one-line error)."""
    if name == "flash_attn":
        return f"is llama.cpp's kernel setting; the {backend} backend runs torch's attention"
    role = name.removesuffix("_gguf")
    return (
        f"is the {role}'s GGUF type on the llamacpp backend; on the {backend} backend the {role} loads at dtype "
        "(--dtype)"
    )


def load_hf(
    target, draft, method, verifier, dtype, gamma, compile, threads, options, verbose, heal, device
) -> Pipeline:
    """The hf backend's loader (backends/registry.py): target and draft as Hugging Face models on `device`, each on
    a CachedLM (threads are not its: torch's threads are the process's)."""
    tokenizer = load_tokenizer(target, verbose)  # first: a folder without one fails before the weights are read
    target_model = load_model(target, dtype, role="target", verbose=verbose, device=device)
    method_options = MethodOptions(**options)
    if draft is not None:
        method_options.draft_model = load_model(draft, dtype, role="draft", verbose=verbose, device=device)
        method_options.draft_tokenizer = draft_tokenizer_for(
            draft, method_options.draft_model, tokenizer, target_model, verbose
        )
    method_options.target_tokenizer = tokenizer
    method_options.compile = compile
    return Pipeline(target_model, tokenizer, method, verifier, method_options, gamma, compile=compile, heal=heal)


def load_llamacpp(
    target, draft, method, verifier, dtype, gamma, compile, threads, options, verbose, heal, device, **backend_options
) -> Pipeline:
    """The llamacpp backend's loader (backends/registry.py): target and draft as GGUF models on llama.cpp contexts
    (backends/llamacpp.py), on the CPU (load() refuses another device)."""
    from . import drafters  # noqa: F401  (fills the registry)
    from .backends import DEFAULT_DRAFT_GGUF, check_draft_gguf, check_gguf_type
    from .backends.base import check_backend
    from .backends.llamacpp import GGUFTokenizer, LlamaCppLM, open_gguf, require_llama_cpp
    from .registry import DRAFTERS, lookup

    draft_gguf, target_gguf, flash_attn = (backend_options.get(k) for k in ("draft_gguf", "target_gguf", "flash_attn"))
    draft_gguf = check_draft_gguf(draft_gguf if draft_gguf is not None else DEFAULT_DRAFT_GGUF)
    if target_gguf is not None:
        check_gguf_type(target_gguf, "target_gguf / --target-gguf", "target")
        if Path(target).suffix == ".gguf":
            raise DraftVerifyError(
                f"target_gguf / --target-gguf converts a model folder; {Path(target).name} is a .gguf file already: "
                "drop the option, or give the model's folder"
            )
    if compile:
        raise DraftVerifyError("--compile is for the hf backend (torch.compile); llama.cpp runs its own kernels")
    require_llama_cpp()
    drafter_cls = lookup(DRAFTERS, "drafter", resolve_method(method).drafter)
    check_backend(LlamaCppLM, drafter_cls, method)  # before any conversion: its class flags say enough
    gguf_target, config = open_gguf(target, dtype, "target", outtype=target_gguf)
    tokenizer = load_tokenizer(target, verbose) if config is not None else GGUFTokenizer(gguf_target)
    kernels = {} if flash_attn is None else {"flash_attn": flash_attn}
    target_lm = LlamaCppLM(gguf_target, role="target", threads=threads, **kernels)
    method_options = MethodOptions(**options)
    if draft is not None:
        gguf_draft, _ = open_gguf(draft, dtype, "draft", outtype=draft_gguf)
        if gguf_draft.vocab_fingerprint() != gguf_target.vocab_fingerprint():
            raise DraftVerifyError(
                f"the draft {str(draft)!r} and the target {str(target)!r} have different "
                "vocabularies; speculative decoding needs a draft with the target's tokenizer"
            )
        method_options.draft_model = LlamaCppLM(gguf_draft, role="draft", threads=threads, **kernels)
    return Pipeline(target_lm, tokenizer, method, verifier, method_options, gamma, heal=heal)
