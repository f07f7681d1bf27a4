"""The one command line: generate, serve, methods, train, export, docs, and the two study groups, `bench <suite>`
(bench/commands.py: the harness a user reruns against peers) and `reproduce <paper>` (reproduce/commands.py: the
seed papers' tables and ablations).

Nothing heavy is imported at module level: --help, --version, `methods` and argument errors answer in well
under a second, and torch/transformers load only when a model does (with a status line saying so). Output
contract of `generate`: the text on stdout, status, warnings and the statistics table on stderr, so
`> file` captures only the text; --json prints one object on stdout.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .bench.commands import bench_app
from .checks import check_max_new_tokens, check_prompt_text, check_sampling, decode_prompt_bytes, gamma_flag
from .cli_flags import declared_flags
from .cli_help import batching_note, draft_methods, flag, one_row_methods
from .devices import DEVICE_HELP, DTYPE_HELP, check_device_form, check_dtype_name
from .draft_length import DEFAULT_GAMMA, parse_gamma
from .errors import DraftVerifyError
from .methods import METHODS, resolve_method
from .options import check_files, parse_values
from .options.checks import check_zoo_ships, unused_flags
from .quiet import quiet_process
from .reproduce.commands import reproduce_app
from .serve import defaults as serve_defaults
from .train.cli import train_app
from .zoo import ZOO_DEFAULT_METHOD, zoo_default_method

if TYPE_CHECKING:
    from .types import GenerationStats

app = typer.Typer(
    name="draftverify",
    help="Draft cheaply, verify with the target in one forward pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(train_app, name="train")
docs_app = typer.Typer(help="The documentation's measured tables, copied from benchmarks/.", no_args_is_help=True)
app.add_typer(docs_app, name="docs")
export_app = typer.Typer(help="Trained pieces in the layouts other engines load.", no_args_is_help=True)
app.add_typer(export_app, name="export")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # messages unwrapped: readable when piped or grepped
INTERRUPTED = 130  # the shell's code for SIGINT


def _version(value: bool) -> None:
    if value:
        print(f"draftverify {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = flag(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Draft cheaply, verify with the target in one forward pass."""


def stats_table(stats: GenerationStats, title: str = "statistics") -> Table:
    table = Table(
        title=title,
        show_header=True,
        header_style="bold",
        caption="alpha: share of the draft tokens the verifier judged that it kept (tokens after a "
        "rejection are never judged, so it is not accepted / drafted)",
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    total = stats.time_total or 1.0
    rows = [
        ("new tokens", f"{stats.new_tokens}"),
        ("target calls", f"{stats.target_calls}"),
        ("draft model calls", f"{stats.draft_calls}"),
        ("mean tokens per target call", f"{stats.tokens_per_call:.2f}"),
        ("acceptance rate alpha (kept / judged drafts)", f"{stats.alpha:.3f}"),
        ("drafted / accepted tokens", f"{stats.drafted_tokens} / {stats.accepted_tokens}"),
        ("time: prefill", f"{stats.time_prefill:.3f} s ({100 * stats.time_prefill / total:.1f}%)"),
        ("time: draft", f"{stats.time_draft:.3f} s ({100 * stats.time_draft / total:.1f}%)"),
        *(
            [
                (
                    "  of which re-tokenizing (draft <-> target text)",
                    f"{stats.time_retokenize:.3f} s ({100 * stats.time_retokenize / total:.1f}%)",
                )
            ]
            if stats.time_retokenize > 0
            else []
        ),
        ("time: target forward", f"{stats.time_target:.3f} s ({100 * stats.time_target / total:.1f}%)"),
        ("time: verify rule", f"{stats.time_verify:.3f} s ({100 * stats.time_verify / total:.1f}%)"),
        ("time: other (loop)", f"{stats.time_other:.3f} s ({100 * stats.time_other / total:.1f}%)"),
        ("loop overhead (verify + other)", f"{100 * stats.loop_overhead_fraction:.1f}%"),
        ("total time", f"{stats.time_total:.3f} s"),
        ("tokens / s", f"{stats.tokens_per_second:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _read_prompt(prompt: str) -> str:
    """`-` reads stdin (as bytes: a non-UTF-8 pipe is an error, not a traceback); else the argument itself."""
    if prompt == "-":
        return check_prompt_text(decode_prompt_bytes(sys.stdin.buffer.read(), "stdin"))
    return check_prompt_text(prompt)


def _default_method(zoo: Optional[str], draft: Optional[str]) -> str:
    if zoo is not None:
        return zoo_default_method(zoo)
    return "model" if draft is not None else "prompt_lookup"


def _ignored_settings(
    method: str,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: Optional[int],
    draft: Optional[str],
    coupling: Optional[bool],
    gamma: str,
    draft_gguf: Optional[str] = None,
) -> list[str]:
    """Settings the user gave that this run will not use (or not as they expect): said out loud instead of
    silently dropped."""
    notes = []
    if temperature > 0 and seed is not None and coupling is False and (gamma == "auto" or gamma.startswith("conf")):
        notes.append(
            f"--seed with --no-coupling and --gamma {gamma} does not fix the text: it depends on where drafts "
            "end, which auto picks from timings; drop --no-coupling (or fix --gamma) to reproduce it"
        )
    if temperature == 0:
        given = [
            flag
            for flag, used in (("--top-k", top_k != 0), ("--top-p", top_p != 1.0), ("--seed", seed is not None))
            if used
        ]
        if given:
            notes.append(f"{', '.join(given)}: used only when sampling; ignored at --temperature 0 (greedy)")
    if draft is not None and not resolve_method(method).needs_draft:
        notes.append(f"--draft is not used by method {method!r} (it drafts without a draft model); ignored")
    if draft_gguf is not None and not resolve_method(method).needs_draft:
        notes.append(f"--draft-gguf is not used by method {method!r} (it drafts without a draft model); ignored")
    return notes


DRAFT_GGUF_HELP = (
    "With --backend llamacpp: the GGUF type a draft model folder is converted at, q8_0 (default), f32, f16 or bf16; "
    "the draft's precision changes which tokens it proposes, never the output."
)
TARGET_GGUF_HELP = (
    "With --backend llamacpp: the GGUF type a target model folder is converted at (default: --dtype's, f32 for "
    "float32): q8_0, q4_k_m, q4_0, q5_k_m or q6_k (all but q8_0 made by llama.cpp's llama-quantize, "
    "scripts/build_llama_cpp_tools.sh) as llama.cpp users run them, f32, f16 or bf16. On a quantized file every "
    "method's text (token trees included) equals "
    "the file's own greedy text with a llama.cpp library built without llamafile's kernels and --no-flash-attn "
    "(docs/backends.md); generate and serve say when it may not."
)
FLASH_ATTN_HELP = (
    "With --backend llamacpp: llama.cpp's flash attention, on by default as llama.cpp runs it, or off. Off, on a "
    "llama.cpp library built without llamafile's kernels (scripts/build_llama_cpp_invariant_lib.sh), a chain's "
    "verify pass scores every token as one-token decoding does, so no near-tie flips on a quantized file "
    "(docs/backends.md)."
)
HEAL_HELP = (
    "Token healing: back the prompt up over its last token and let the first new token start with its text "
    "(a prompt ending in a newline then continues as trained text does). Default: on with --zoo (decoder-only "
    "targets), off otherwise; --no-heal for text equal to a peer that does not heal."
)


def _method_options(method: str, zoo: Optional[str], given: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The declared options' flags as load() takes them (parsed), checked before anything loads: files given
    exist, and a zoo entry ships every file the method's drafter needs that was not given."""
    options = parse_values(given or {})
    check_files(options)
    if zoo is not None:
        check_zoo_ships(zoo, method, options)
    return options


def _heal_default(heal: Optional[bool], zoo: Optional[str], pipe) -> bool:
    """--heal/--no-heal as given; unset: on for a zoo's decoder-only target, off otherwise."""
    if heal is not None:
        return pipe.check_heal(heal)
    return zoo is not None and not pipe.target.is_encoder_decoder


def _load_pipeline(**load_args):
    """api.load(**load_args) with torch on load_args' threads too (None: its default), the libraries' chatter off."""
    quiet_process()
    if (threads := load_args.get("threads")) is not None:
        import torch

        torch.set_num_threads(threads)
    from .api import load

    return load(**load_args)


def _say_llamacpp_exactness(pipe) -> None:
    """A note when a drafting method on a quantized llama.cpp target may part from the file's own greedy text."""
    from .backends.llamacpp import LlamaCppLM

    target = pipe.target
    if not isinstance(target, LlamaCppLM) or pipe.method.name == "autoregressive":
        return
    from .backends.llamacpp_kernels import covered_file_type, exactness_note, is_quantized

    file_type = target.model.file_type()
    note = exactness_note(is_quantized(file_type), target.chains_exact, covered_file_type(file_type))
    if note:
        err_console.print(f"[yellow]note:[/yellow] {escape(note)}")


def _check_backend_flags(
    backend: str,
    compile_: bool,
    batched: bool,
    draft_gguf: str | None = None,
    target_gguf: str | None = None,
    method: str | None = None,
    flash_attn: bool | None = None,
) -> None:
    """--backend and what it cannot combine with (batched: the method's drafter in batches), before anything
    loads."""
    from .backends import check_gguf_type
    from .backends.registry import backends_that, target_backend

    entry = target_backend(backend, "--backend")
    for role, value in (("draft", draft_gguf), ("target", target_gguf)):
        if value is None:
            continue
        check_gguf_type(value, f"--{role}-gguf", role)
        if f"{role}_gguf" not in entry.own_options:
            raise DraftVerifyError(
                f"--{role}-gguf is the {role}'s GGUF type on --backend llamacpp; with --backend "
                f"{backend} the {role} loads at --dtype"
            )
    if flash_attn is not None and "flash_attn" not in entry.own_options:
        raise DraftVerifyError(
            f"--flash-attn/--no-flash-attn is llama.cpp's kernel setting (--backend llamacpp); --backend {backend} "
            "runs torch's attention"
        )
    if not entry.installed():
        raise DraftVerifyError(f"--backend {backend} needs {entry.package}: {entry.install}")
    if compile_ and not entry.compiles:
        raise DraftVerifyError(
            f"--compile is for --backend {backends_that('compiles')} (torch.compile); --backend "
            f"{backend} runs its own kernels"
        )
    if batched and not entry.batches:
        raise DraftVerifyError(
            f"--backend {backend} decodes one prompt at a time: add --batch-size 1, or use "
            f"--backend {backends_that('batches')} for batches"
        )
    if batched and method is not None:
        from . import drafters  # noqa: F401  (fills the registry)
        from .backends.base import check_backend
        from .registry import DRAFTERS, lookup

        check_backend(entry.backend_class(), lookup(DRAFTERS, "drafter", resolve_method(method).drafter), method, True)


@app.command()
@declared_flags()
def generate(
    prompt: Optional[str] = flag(
        None, "--prompt", "-p", help="Text to continue (the source text for seq2seq models); '-' reads stdin."
    ),
    prompts_file: Optional[Path] = flag(
        None,
        "--prompts-file",
        help="Generate for many prompts as one batch: a .jsonl file (each line a JSON string or an object with a "
        '"prompt") or a text file (one prompt per line); prints one JSON line per prompt. ' + batching_note(),
    ),
    batch_size: int = flag(
        8, "--batch-size", help="With --prompts-file: rows decoded together (the last batch may be smaller)."
    ),
    target: Optional[str] = flag(None, "--target", "-t", help="Target model: local directory or hub id."),
    draft: Optional[str] = flag(None, "--draft", "-d", help=f"Draft model (methods {draft_methods()})."),
    zoo: Optional[str] = flag(None, "--zoo", help="Use a shipped model set, e.g. 'code'."),
    method: Optional[str] = flag(
        None,
        "--method",
        "-m",
        help=f"One of: {', '.join(METHODS)}. Default: the zoo's own (code: {ZOO_DEFAULT_METHOD}) with --zoo, model "
        "with --draft, else prompt_lookup.",
    ),
    verifier: Optional[str] = flag(
        None,
        "--verifier",
        help="Override the method's verifier: greedy, speculative_sampling, gumbel_coupling, bild, topbeta, "
        "tree_greedy, tree_speculative_sampling.",
    ),
    max_new_tokens: int = flag(64, "--max-new-tokens", "-n"),
    temperature: float = flag(0.0, "--temperature", help="0 = greedy."),
    top_k: int = flag(0, "--top-k", help="0 = off."),
    top_p: float = flag(1.0, "--top-p", help="1 = off."),
    seed: Optional[int] = flag(
        None,
        "--seed",
        help="Seeded sampling is coupled: the same seed gives the same text for every method and draft length.",
    ),
    coupling: Optional[bool] = flag(
        None, "--coupling/--no-coupling", help="Position-keyed (Gumbel-max) sampling; default: on when --seed is given."
    ),
    gamma: str = flag(
        str(DEFAULT_GAMMA),
        "--gamma",
        help="Draft length: an integer in 1..64, 'heuristic', 'auto' (Theorem 8) or 'conf[=T]' (auto's length as a "
        "cap; a draft-model draft ends at its first token with max q <= T, default 0.4).",
    ),
    device: str = flag("cpu", "--device", help=DEVICE_HELP),
    dtype: str = flag("auto", "--dtype", help=DTYPE_HELP),
    compile_: bool = flag(
        False,
        "--compile",
        help="Preallocated KV caches + torch.compile of the target and draft model (decoder-only), for the verify "
        "widths the method uses, compiled before generating (tens of seconds per graph on a CPU); pays off only over "
        "many generations in one process, and says after how many tokens.",
    ),
    threads: Optional[int] = flag(None, "--threads", help="CPU threads for torch (default: torch's choice)."),
    lean_draft: bool = flag(
        True,
        "--lean-draft/--no-lean-draft",
        help="Run a Llama / Mistral / Qwen2 draft model on the lean backend (plain torch ops over a preallocated KV "
        "buffer; one prompt, eager); --no-lean-draft keeps Hugging Face's forward (env DRAFTVERIFY_LEAN_DRAFT=0 does "
        "the same).",
    ),
    as_json: bool = flag(False, "--json", help="Print one JSON object (text + stats) instead of streaming."),
    heal: Optional[bool] = flag(None, "--heal/--no-heal", help=HEAL_HELP),
    backend: str = flag(
        "hf",
        "--backend",
        help="What runs the target and draft models: hf (transformers) or llamacpp (llama.cpp via llama-cpp-python: "
        'pip install -e ".[llamacpp]"; a .gguf path, or a model folder converted to GGUF at --dtype on first use and '
        "cached under ~/.cache/draftverify/gguf). llamacpp runs the methods that need only the target's logits, "
        "chain methods in batches too.",
    ),
    draft_gguf: Optional[str] = flag(None, "--draft-gguf", help=DRAFT_GGUF_HELP),
    target_gguf: Optional[str] = flag(None, "--target-gguf", help=TARGET_GGUF_HELP),
    flash_attn: Optional[bool] = flag(None, "--flash-attn/--no-flash-attn", help=FLASH_ATTN_HELP),
    options: Optional[dict[str, Any]] = None,  # the declared method options' flags (cli_flags.py)
) -> None:
    """Generate text with a draft-then-verify method: the text on stdout, the statistics table on stderr."""
    try:
        method = method or _default_method(zoo, draft)
        # every check that needs no model runs before anything is imported, loaded or printed
        resolve_method(method)
        options = _method_options(method, zoo, options)
        parse_gamma(gamma_flag(gamma))
        check_sampling(temperature, top_k, top_p, seed, coupling)
        check_max_new_tokens(max_new_tokens)
        if threads is not None and threads < 1:
            raise DraftVerifyError(f"--threads must be >= 1, got {threads}")
        check_device_form(device)
        check_dtype_name(dtype)
        if (prompt is None) == (prompts_file is None):
            raise DraftVerifyError("give exactly one of --prompt and --prompts-file")
        if batch_size < 1:
            raise DraftVerifyError(f"--batch-size must be >= 1, got {batch_size}")
        _check_backend_flags(
            backend, compile_, prompts_file is not None and batch_size > 1, draft_gguf, target_gguf, method, flash_attn
        )
        texts = read_prompts_file(prompts_file) if prompts_file is not None else None
        text_in = _read_prompt(prompt) if texts is None else texts[0]
        for note in _ignored_settings(
            method, temperature, top_k, top_p, seed, draft, coupling, gamma, draft_gguf
        ) + unused_flags(method, options):
            err_console.print(f"[yellow]warning:[/yellow] {escape(note)}")
        source = f"zoo {zoo!r}" if zoo and not target else repr(target)
        loading = f"loading {method}: target {source}" + (f", draft {draft!r}" if draft else "") + " ..."
        err_console.print(f"[dim]{escape(loading)}[/dim]")
        pipe = _load_pipeline(
            target=target,
            draft=draft,
            method=method,
            verifier=verifier,
            zoo=zoo,
            dtype=dtype,
            device=device,
            gamma=gamma_flag(gamma),
            compile=compile_,
            lean_draft=lean_draft,
            backend=backend,
            threads=threads,
            draft_gguf=draft_gguf,
            target_gguf=target_gguf,
            flash_attn=flash_attn,
            **options,
        )
        pipe.heal = _heal_default(heal, zoo, pipe)
        _say_llamacpp_exactness(pipe)
        sampling = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            coupling=coupling,
        )
        if texts is not None:
            _generate_batches(pipe, texts, batch_size, as_json, method, **sampling)
            return
        compiled = _precompile(pipe, text_in, max_new_tokens) if pipe.compiled else None
        echoed = []  # the prompt is echoed with the first new text, i.e. only once every check has passed
        echo = "" if pipe.target.is_encoder_decoder else text_in  # a translation does not continue its source

        def stream(piece: str) -> None:
            if not echoed:
                sys.stdout.write(echo)
                echoed.append(True)
            sys.stdout.write(piece)
            sys.stdout.flush()

        on_text = None if as_json else stream

        result = pipe.generate(text_in, on_text=on_text, **sampling)
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        sys.stdout.flush()
        err_console.print("\n[yellow]interrupted[/yellow]")
        raise typer.Exit(INTERRUPTED) from None
    if as_json:
        print(json.dumps({"text": result.text, "method": method, "stats": result.stats.as_dict()}))
    else:
        if not echoed:  # nothing was generated (an immediate end of text): the prompt alone
            sys.stdout.write(echo)
        sys.stdout.write("\n")
        sys.stdout.flush()
        err_console.print(stats_table(result.stats, title=f"{method} (verifier: {result.verifier})"))
    if compiled is not None:
        _compile_verdict(*compiled, result.stats)


def _precompile(pipe, text: str, max_new_tokens: int):
    """--compile: say what compiles, compile it before generating (a line per graph), say how long it took, and
    time each compiled model eager vs compiled (for _compile_verdict). Returns (seconds, comparison)."""
    from .compiling import compare, graph_count

    models = pipe.compiled
    shapes = "; ".join(
        f"{lm.role} at width{'s' if len(lm.widths) > 1 else ''} {', '.join(map(str, lm.widths))}" for lm in models
    )
    err_console.print(
        f"compiling {graph_count(models)} graphs with torch.compile before generating ({shapes}): "
        "tens of seconds each on a CPU, once per process"
    )
    seconds = pipe.precompile(text, max_new_tokens, log=lambda line: err_console.print(f"[dim]{escape(line)}[/dim]"))
    err_console.print(f"compiled {graph_count(models)} graphs in {seconds:.1f} s")
    return seconds, compare(pipe.target, pipe.drafter, pipe.encode(text))


def _compile_verdict(seconds: float, comparison, stats) -> None:
    """Whether --compile paid for itself in this run, and after how many tokens it would (measured here)."""
    from .compiling import break_even_tokens

    per_call = stats.draft_calls / stats.target_calls if stats.target_calls else 0.0
    tokens = break_even_tokens(seconds, comparison, stats.tokens_per_call, per_call)
    measured = escape(comparison.describe())
    if tokens is None:
        err_console.print(
            f"[yellow]warning:[/yellow] --compile does not pay off on this machine: compiled forwards "
            f"were no faster than eager ({measured}) and compiling took {seconds:.0f} s; run without "
            "--compile"
        )
    elif tokens > stats.new_tokens:
        err_console.print(
            f"[yellow]warning:[/yellow] --compile pays off only over many generations in one process "
            f"(the Python API's load(compile=True), bench --compile), not for one: compiling took "
            f"{seconds:.0f} s and saves {comparison.saving_ms(per_call):.1f} ms per target call here "
            f"({measured}), so it breaks even after about {tokens:,.0f} generated tokens; this run "
            f"made {stats.new_tokens}"
        )


def read_prompts_file(path: Path) -> list[str]:
    """Prompts of --prompts-file: JSON lines (a string, or an object with "prompt") for .jsonl, else one per line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DraftVerifyError(f"cannot read --prompts-file {str(path)!r}: {err.strerror}") from None
    text = decode_prompt_bytes(raw, str(path))
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise DraftVerifyError(f"{path}:{number} is not JSON: {err}") from None
            item = item.get("prompt") if isinstance(item, dict) else item
            if not isinstance(item, str):
                raise DraftVerifyError(f'{path}:{number} must be a JSON string or an object with a "prompt" string')
            line = item
        prompts.append(check_prompt_text(line))
    if not prompts:
        raise DraftVerifyError(f"--prompts-file {str(path)!r} holds no prompts")
    return prompts


def _generate_batches(pipe, texts: list[str], batch_size: int, as_json: bool, method: str, **settings) -> None:
    """--prompts-file: batches of batch_size rows through the loop; one JSON line per prompt on stdout."""
    from .types import GenerationStats

    total = GenerationStats()
    records = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        results = pipe.generate(chunk, **settings)
        for index, (prompt, result) in enumerate(zip(chunk, results), start):
            record = {"index": index, "prompt": prompt, "text": result.text}
            records.append(record)
            if not as_json:
                print(json.dumps(record, ensure_ascii=False), flush=True)
        stats = results[0].stats
        for name in (
            "prompt_tokens",
            "new_tokens",
            "target_calls",
            "draft_calls",
            "drafted_tokens",
            "accepted_tokens",
            "rejections",
            "prefill_steps",
            "prefill_draft_calls",
            "time_prefill",
            "time_draft",
            "time_target",
            "time_verify",
            "time_retokenize",
            "time_total",
        ):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        total.gammas.extend(stats.gammas)
        total.chosen_gammas.extend(stats.chosen_gammas)
    if as_json:
        print(
            json.dumps(
                {"method": method, "batch_size": batch_size, "results": records, "stats": total.as_dict()},
                ensure_ascii=False,
            )
        )
        return
    err_console.print(
        stats_table(
            total, title=f"{method}, {len(texts)} prompts in batches of {batch_size} (target calls are batch steps)"
        )
    )


def check_port_free(host: str, port: int) -> None:
    """Bind host:port as the server will (SO_REUSEADDR, as uvicorn sets it) and let go at once; a port another
    process listens on, an address this machine does not have, or a privileged port is a DraftVerifyError that
    says what to do. (Something may still take the port while the model loads; uvicorn then reports it.)"""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise DraftVerifyError(
            f"--host {host!r} is not an address of this machine ({err.strerror}); "
            "use 127.0.0.1, 0.0.0.0 or one of its addresses"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise DraftVerifyError(
                    f"port {port} on {host} is already in use (another server?): stop what "
                    "listens there or pick a free port with --port"
                ) from None
            if err.errno == errno.EACCES:
                raise DraftVerifyError(
                    f"no permission to listen on port {port} (ports below 1024 need root): pick --port 1024 or above"
                ) from None
            raise DraftVerifyError(f"cannot listen on {host}:{port}: {err.strerror}; check --host and --port") from None


@app.command()
@declared_flags()
def serve(
    target: Optional[str] = flag(None, "--target", "-t", help="Target model: local directory or hub id."),
    draft: Optional[str] = flag(None, "--draft", "-d", help=f"Draft model (methods {draft_methods()})."),
    zoo: Optional[str] = flag(None, "--zoo", help="Serve a shipped model set, e.g. 'code'."),
    method: Optional[str] = flag(
        None,
        "--method",
        "-m",
        help=f"One of: {', '.join(METHODS)}. Default: {ZOO_DEFAULT_METHOD} with --zoo, model with --draft, else "
        f"prompt_lookup. Batching (--max-batch > 1): every method but {one_row_methods()}, which serve one request at "
        "a time (a model draft with its own tokenizer runs as cross_tokenizer).",
    ),
    verifier: Optional[str] = flag(None, "--verifier", help="Override the method's verifier."),
    gamma: str = flag(
        str(DEFAULT_GAMMA),
        "--gamma",
        help="Draft length: an integer in 1..64, 'heuristic', 'auto' (Theorem 8 for each step's number of rows; 0, no "
        "draft, where none pays) or 'conf[=T]' (auto's length as a cap; a draft-model draft ends at its first token "
        "with max q <= T, default 0.4).",
    ),
    device: str = flag("cpu", "--device", help=DEVICE_HELP),
    dtype: str = flag("auto", "--dtype", help=DTYPE_HELP),
    compile_: bool = flag(
        False,
        "--compile",
        help="Preallocated KV caches + torch.compile of the target and draft model (decoder-only), for the verify "
        "widths the method uses; the first requests pay the compilation (tens of seconds per graph on a CPU).",
    ),
    threads: Optional[int] = flag(None, "--threads", help="CPU threads for torch."),
    host: str = flag("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = flag(8000, "--port"),
    api_key: Optional[str] = flag(
        None,
        "--api-key",
        envvar="DRAFTVERIFY_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1 (env DRAFTVERIFY_API_KEY).",
    ),
    served_model_name: Optional[str] = flag(
        None,
        "--served-model-name",
        help="The model id clients send (default: the zoo name or the target folder's name).",
    ),
    max_queue: int = flag(
        serve_defaults.MAX_QUEUE, "--max-queue", help="Requests that may wait; more get 429 with Retry-After."
    ),
    max_batch: int = flag(
        8,
        "--max-batch",
        help="Requests decoded together as one batch, whatever their sampling settings (each row keeps its own; a "
        "--verifier override batches only requests with equal settings); requests join and leave the batch between "
        "steps (1: one at a time).",
    ),
    max_tokens_limit: Optional[int] = flag(
        None, "--max-tokens-limit", help="Largest max_tokens a request may ask for (default: the model's context)."
    ),
    stream_interval: float = flag(
        serve_defaults.STREAM_INTERVAL,
        "--stream-interval",
        help="Least seconds between two chunks of a streamed answer: a step's text waits for later steps' until "
        "then (the first chunk goes at once; 0: every step's text at once). Each chunk wakes the server's event "
        "loop, which takes a core from the decoding threads.",
    ),
    ray: bool = flag(False, "--ray", help="Serve with Ray Serve (pip install 'draftverify[ray]')."),
    replicas: int = flag(1, "--replicas", help="With --ray: model replicas, each with its own worker."),
    log_level: str = flag("info", "--log-level", help="uvicorn's log level."),
    heal: Optional[bool] = flag(
        None,
        "--heal/--no-heal",
        help=HEAL_HELP + ' /v1/completions only; a request may set its own with the extension field "heal".',
    ),
    backend: str = flag(
        "hf",
        "--backend",
        help="hf (transformers) or llamacpp (llama.cpp via llama-cpp-python; tree methods one request at a time).",
    ),
    draft_gguf: Optional[str] = flag(None, "--draft-gguf", help=DRAFT_GGUF_HELP),
    target_gguf: Optional[str] = flag(None, "--target-gguf", help=TARGET_GGUF_HELP),
    flash_attn: Optional[bool] = flag(None, "--flash-attn/--no-flash-attn", help=FLASH_ATTN_HELP),
    options: Optional[dict[str, Any]] = None,  # the declared method options' flags (cli_flags.py)
) -> None:
    """Serve a method over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics)."""
    try:
        method = method or _default_method(zoo, draft)
        resolve_method(method)
        options = _method_options(method, zoo, options)
        parse_gamma(gamma_flag(gamma))
        check_device_form(device)
        check_dtype_name(dtype)
        for flag, value in (
            ("--threads", threads),
            ("--max-queue", max_queue),
            ("--max-batch", max_batch),
            ("--max-tokens-limit", max_tokens_limit),
            ("--replicas", replicas),
        ):
            if value is not None and value < 1:
                raise DraftVerifyError(f"{flag} must be >= 1, got {value}")
        if not 0 <= port <= 65535:
            raise DraftVerifyError(f"--port must be in 0..65535, got {port}")
        if zoo is None and target is None:
            raise DraftVerifyError("no model: give --zoo NAME or --target PATH")
        if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
            raise DraftVerifyError("serving needs the 'serve' extra: pip install 'draftverify[serve]'")
        check_port_free(host, port)  # before the model loads: a taken port is a one-line exit 2, not uvicorn's
        name = served_model_name or (zoo if zoo and not target else Path(str(target)).name)
        _check_backend_flags(backend, compile_, False, draft_gguf, target_gguf, flash_attn=flash_attn)
        load_args = dict(
            target=target,
            draft=draft,
            method=method,
            verifier=verifier,
            zoo=zoo,
            dtype=dtype,
            device=device,
            gamma=gamma_flag(gamma),
            compile=compile_,
            backend=backend,
            threads=threads,
            draft_gguf=draft_gguf,
            target_gguf=target_gguf,
            flash_attn=flash_attn,
            **options,
        )
        from .serve.app import ServerSettings

        settings = ServerSettings(
            model_name=name,
            api_key=api_key,
            max_queue=max_queue,
            max_batch=max_batch,
            max_tokens_limit=max_tokens_limit,
            heal=heal if heal is not None else zoo is not None,
            stream_interval=stream_interval,
        )
        if ray:
            from .serve.ray_serve import run_ray

            run_ray(load_args, settings, replicas=replicas, host=host, port=port, threads=threads)
            return
        err_console.print(f"[dim]loading {escape(method)}: {escape(name)} ...[/dim]")
        from .serve.app import create_app

        pipe = _load_pipeline(**load_args)
        settings.heal = _heal_default(heal, zoo, pipe)
        _say_llamacpp_exactness(pipe)
        if settings.max_batch > 1 and not pipe.supports_batches:
            why = "with --compile" if pipe.compiled else ""
            err_console.print(
                f"note: {escape(method)} decodes one row at a time{why and ' ' + why}: requests are "
                "served one at a time (--max-batch 1)"
            )
            settings.max_batch = 1
        app_ = create_app(pipe, settings)
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    import uvicorn

    err_console.print(
        f"serving {escape(name)} ({escape(method)}) on http://{host}:{port}/v1"
        + (" (API key required)" if api_key else "")
    )
    uvicorn.run(app_, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


@app.command()
def methods() -> None:
    """List the methods: which drafter and verifier each one plugs into the loop, and what its declaration says
    (whether it needs a draft model, batches rows, is lossless)."""
    table = Table(show_header=True, header_style="bold")
    for column in ("method", "drafter", "verifier", "what it does"):
        table.add_column(column)
    for name, m in METHODS.items():
        facts = [
            fact
            for fact, holds in (
                ("draft model", m.needs_draft),
                ("one row at a time", not m.batches),
                ("not lossless", not m.lossless),
            )
            if holds
        ]
        notes = f" [dim]({', '.join(facts)})[/dim]" if facts else ""
        table.add_row(name, m.drafter, m.verifier, escape(m.summary) + notes)
    console.print(table)


@docs_app.command("tables")
def docs_tables(
    root: Path = typer.Option(Path("."), "--root", help="The repository root (README.md, docs/, benchmarks/)."),
    check: bool = typer.Option(
        False, "--check", help="Write nothing; exit 1 if a page's tables differ from their benchmark files."
    ),
) -> None:
    """Copy every marked table in README.md and docs/ afresh from its benchmark file."""
    from .docs_tables import stale_pages, update_pages

    try:
        pages = stale_pages(root) if check else update_pages(root)
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    for page in pages:
        print(f"{'stale' if check else 'updated'}: {page}")
    if check and pages:
        err_console.print("run `draftverify docs tables` to copy the tables from benchmarks/")
        raise typer.Exit(1)


@export_app.command("eagle3")
def export_eagle3_cmd(
    head: Path = typer.Argument(..., help="The head's folder (`draftverify train eagle3` writes one)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the EAGLE-3 checkpoint to."),
    target: Path = typer.Option(
        Path("zoo/code/target"), "--target", help="The target's Hugging Face folder (checked; the GGUF's tokenizer)."
    ),
    gguf: str | None = typer.Option(
        None,
        "--gguf",
        help="Also write eagle3-TYPE.gguf for llama.cpp's --spec-type draft-eagle3 (f32, f16, bf16, q8_0).",
    ),
) -> None:
    """An EAGLE-3 head as the checkpoint llama.cpp's converter and vLLM's eagle3 method load (and as GGUF)."""
    from .eagle3_export import export_eagle3

    try:
        paths = export_eagle3(head, out, target, gguf)
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    for what, path in paths.items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    app()
