"""`draftverify bench overhead --backend llamacpp`: what our loop spends outside llama_decode, per token and per
step, beside a bare ctypes loop over the same library and GGUF file (bench/bare_loop.py), runners interleaved
prompt by prompt, greedy.

Time inside llama_decode is read off backends.llamacpp.DECODE_CLOCK (every context of the process: the target's
and a draft model's); the rest of a generation's wall time (ids in, ids out: `Pipeline.generate_ids`) is the
loop's own, drafters' Python included. The bare loop's rest is what any Python loop over llama-cpp-python pays.

With llama.cpp's tools built (scripts/build_llama_cpp_tools.sh), llama.cpp's own `llama-server` decodes the same
prompts too (one greedy /completion each, its own prompt_ms + predicted_ms, as `bench native` times it), so the file
splits our distance from llama.cpp's plain decoding in two: our loop beside the bare loop, and any Python loop over
llama-cpp-python's library beside llama.cpp's own binary. Two builds of it run: the static one `bench native`
compares against, and llama.cpp's default build (shared libraries, as its CMake and release archives make it, and as
llama-cpp-python builds the library it ships). Run under LLAMA_CPP_LIB_PATH, the Python rows load
the library it names, such as the one scripts/build_llama_cpp_lib.sh builds (the file names the library)."""

from __future__ import annotations

import sys
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..draft_length import DEFAULT_GAMMA
from ..errors import DraftVerifyError
from .folders import COST

if TYPE_CHECKING:
    from .config import ModelChoice

DEFAULT_METHODS = ("autoregressive", "prompt_lookup", "suffix", "model")
BARE = "bare ctypes loop"
SERVER_ROW = "llama.cpp's llama-server"  # the static build, bench native's yardstick
DEFAULT_BUILD_ROW = "llama.cpp's llama-server, default build"  # shared libraries, as llama.cpp builds by default


def render(result: dict) -> str:
    from ..backends.llamacpp_kernels import library_lines
    from ..markdown import markdown_table

    rows = []
    for r in result["rows"]:
        split = r["decode_s"] is not None  # llama-server's own time is not split at llama_decode
        rows.append(
            [
                r["runner"],
                str(r["new_tokens"]),
                str(r["steps"]),
                f"{r['tok_s']:.1f}",
                f"{r['ms_per_token']:.3f}",
                f"{r['decode_ms_per_token']:.3f}" if split else "-",
                f"{r['outside_ms_per_token']:.3f}" if split else "-",
                f"{r['outside_us_per_step']:.0f}" if split else "-",
                f"{r['outside_share']:.1f}%" if split else "-",
                f"**{r['vs_bare']:.3f}x**",
                "yes" if r["same_tokens"] else "no",
            ]
        )
    columns = [
        "runner",
        "new tokens",
        "steps",
        "tok/s",
        "ms / token",
        "in llama_decode, ms / token",
        "outside, ms / token",
        "outside, µs / step",
        "outside, share of a step",
        "tok/s vs bare loop",
        "tokens = bare loop's",
    ]
    lines = [
        "# Loop overhead on llama.cpp",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores), "
        f"{result['threads']} thread(s); {result['gguf']}; {result['prompts']} prompts of {result['prompt_set']} x "
        f"{result['max_new_tokens']} new tokens, greedy, draft length {result.get('gamma', DEFAULT_GAMMA)}, "
        f"{result['rounds']} round(s) after a warm-up, runners interleaved prompt by prompt.",
        "",
        *library_lines(result.get("llama_cpp_library"), result.get("flash_attn"), "The Python rows'"),
        *markdown_table(columns, rows),
        "",
        f"Outside = wall time (token ids in, token ids out) minus the seconds inside `llama_decode` (every context: "
        f"the target's and a draft model's); a step is one target forward (the {BARE}: one token). The {BARE} "
        "decodes the same file on the same kind of context with a reused batch and a NumPy argmax over a view of "
        "the logits (bench/bare_loop.py): what it spends outside llama_decode, any Python loop over the library "
        "spends.",
        "",
        _server_note(result),
        "",
    ]
    return "\n".join(lines)


def _server_note(result: dict) -> str:
    server = result.get("server")
    if not server:
        return f"No {SERVER_ROW} row: {result.get('server_skipped') or 'not run'}."
    note = (
        f"The row {SERVER_ROW} is llama.cpp's own `{server['binary']}`, built from the vendored source by "
        "scripts/build_llama_cpp_tools.sh with llama.cpp linked in statically (the build `draftverify bench native` "
        "compares against), on the same file and threads, one greedy `/completion` per prompt with `n_predict` = "
        "the tokens asked, timed by its own `prompt_ms` + `predicted_ms` (HTTP not counted), as `bench native` "
        f"times it: {_ratios(server)}."
    )
    default = result.get("server_default_build")
    if not default:
        return note + f" No {DEFAULT_BUILD_ROW} row: llama-server was not built with shared libraries beside it."
    return note + (
        f" The row {DEFAULT_BUILD_ROW} is the same server built as llama.cpp's own CMake and release archives build "
        "it by default, with shared libraries and llama.cpp's own compiler flags (as llama-cpp-python builds the "
        f"library it ships), timed the same way: {_ratios(default)}; the static build decodes at "
        f"**{default['static_vs_default']:.3f}x** its tok/s."
    )


def _ratios(server: dict) -> str:
    ours = server["autoregressive_vs_server"]
    return (f"our `autoregressive` runs at **{ours:.3f}x** its tok/s, " if ours is not None else "") + (
        f"the bare loop at **{server['bare_vs_server']:.3f}x**"
    )


def _row(name: str, tokens: int, steps: int, wall: float, decode: float | None, same: bool, bare_tok_s: float) -> dict:
    """One runner's totals; decode None (llama-server: its time is not split at llama_decode) leaves the split
    columns None."""
    tok_s = tokens / wall
    outside = None if decode is None else wall - decode
    return {
        "runner": name,
        "new_tokens": tokens,
        "steps": steps,
        "wall_s": wall,
        "decode_s": decode,
        "tok_s": tok_s,
        "ms_per_token": 1000 * wall / tokens,
        "decode_ms_per_token": None if decode is None else 1000 * decode / tokens,
        "outside_ms_per_token": None if outside is None else 1000 * outside / tokens,
        "outside_us_per_step": None if outside is None else 1e6 * outside / steps,
        "outside_share": None if outside is None else 100 * outside / wall,
        "vs_bare": tok_s / bare_tok_s if bare_tok_s else 1.0,
        "same_tokens": same,
    }


def run_overhead_llamacpp(
    methods: tuple[str, ...] = DEFAULT_METHODS,
    choice: ModelChoice | None = None,
    new_tokens: int = 96,
    threads: int = 2,
    target_gguf: str | None = None,
    prompt_set: str = "humaneval",
    num_prompts: int = 8,
    rounds: int = 2,
    out: str | Path = COST,
    name: str = "loop-overhead-llamacpp",
    command: str = "",
    options: dict[str, Any] | None = None,
    gamma: int | str = DEFAULT_GAMMA,
) -> dict:
    import torch

    from ..api import load
    from ..backends.llamacpp import DECODE_CLOCK
    from ..backends.llamacpp_kernels import library
    from ..types import SamplingParams
    from . import environment
    from .bare_loop import BareLoop
    from .config import ModelChoice
    from .prompts import load_prompts
    from .report import write_result

    if not methods:
        raise DraftVerifyError("--methods names no method")
    prompts = load_prompts(prompt_set)[:num_prompts]  # a wrong set is refused before any model loads
    torch.set_num_threads(threads)
    choice = choice or ModelChoice()
    pipes = {
        method: load(
            **choice.load_args(),
            method=method,
            gamma=gamma,
            backend="llamacpp",
            threads=threads,
            target_gguf=target_gguf,
            **(options or {}),
        )
        for method in methods
    }
    first = next(iter(pipes.values()))
    gguf = Path(first.target.model.path)
    bare = BareLoop(gguf, threads)
    servers, skipped = _start_servers(gguf, threads, first.target)
    eos = first.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    ids = [first.tokenizer(p.text).input_ids for p in prompts]
    params = SamplingParams()

    names = [BARE, *pipes, *servers]
    totals: dict[str, dict[str, float]] = {n: dict(tokens=0, steps=0, wall=0.0, decode=0.0) for n in names}
    same = {n: True for n in names if n != BARE}

    def served(server, prompt: list[int], limit: int) -> tuple[list[int], float]:
        reply = server.complete(prompt, limit)
        seconds = (reply["timings"]["prompt_ms"] + reply["timings"]["predicted_ms"]) / 1000
        return [int(t) for t in reply["tokens"]][:limit], seconds

    def ours(pipe, prompt: list[int], limit: int) -> tuple[list[int], int, float, float]:
        seconds, started = DECODE_CLOCK.seconds, perf_counter()
        output, _ = pipe.generate_ids(torch.tensor([prompt]), params, max_new_tokens=limit)
        wall = perf_counter() - started
        return output.rows[0], len(output.stats.gammas), wall, DECODE_CLOCK.seconds - seconds

    for pipe in pipes.values():  # warm-up: first calls allocate, convert and page the files in
        ours(pipe, ids[0], 8)
    bare.generate(ids[0], 8, eos_ids)
    for server in servers.values():
        served(server, ids[0], 8)
    for _ in range(rounds):
        for prompt in ids:
            started = perf_counter()
            expected, decode = bare.generate(prompt, new_tokens, eos_ids)
            t = totals[BARE]
            t["wall"] += perf_counter() - started
            t["decode"] += decode
            t["tokens"] += len(expected)
            t["steps"] += len(expected)
            for method, pipe in pipes.items():
                got, steps, wall, decode = ours(pipe, prompt, new_tokens)
                t = totals[method]
                t["wall"] += wall
                t["decode"] += decode
                t["tokens"] += len(got)
                t["steps"] += steps
                same[method] = same[method] and got == expected
            for row, server in servers.items():
                got, wall = served(server, prompt, new_tokens)
                t = totals[row]
                t["wall"] += wall
                t["tokens"] += len(got)
                t["steps"] += len(got)
                same[row] = same[row] and _without_eos(got, eos_ids) == _without_eos(expected, eos_ids)
    bare.close()
    for server in servers.values():
        server.close()
    bare_tok_s = totals[BARE]["tokens"] / totals[BARE]["wall"]
    rows = [
        _row(
            n,
            int(t["tokens"]),
            int(t["steps"]),
            t["wall"],
            None if n in servers else t["decode"],
            same.get(n, True),
            bare_tok_s,
        )
        for n, t in totals.items()
    ]
    result = {
        **environment.header(name, command),
        "threads": threads,
        "gguf": gguf.name if choice.target is None else str(gguf),
        "target_gguf": target_gguf,
        "prompt_set": prompt_set,
        "prompts": len(prompts),
        "max_new_tokens": new_tokens,
        "rounds": rounds,
        "gamma": gamma,
        "rows": rows,
        "server": _server_summary(rows, servers.get(SERVER_ROW), SERVER_ROW),
        "server_default_build": _server_summary(rows, servers.get(DEFAULT_BUILD_ROW), DEFAULT_BUILD_ROW),
        "server_skipped": skipped,
        "llama_cpp_library": library(sys.modules["llama_cpp.llama_cpp"]),
        "flash_attn": first.target.flash_attn,
    }
    return write_result(result, out, name, render)


def _without_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """The tokens without a final EOS (the bare loop keeps it, llama-server's reply may leave it out)."""
    return tokens[:-1] if tokens and tokens[-1] in eos_ids else tokens


def _start_servers(gguf: Path, threads: int, target) -> tuple[dict[str, Any], str | None]:
    """llama.cpp's own llama-server on the target's GGUF file with the backend's context settings, by row: the
    static build and, when built beside it, llama.cpp's default (shared-library) build; none and why not when the
    tools are not built (scripts/build_llama_cpp_tools.sh)."""
    from ..backends.gguf import default_build_dir, tools_dir
    from .llamacpp_native import SERVER, NativeServer

    try:
        folders = {SERVER_ROW: tools_dir()}
    except DraftVerifyError as err:
        return {}, str(err)
    default = default_build_dir()
    if default is not None:
        folders[DEFAULT_BUILD_ROW] = default
    servers = {
        row: NativeServer(
            folder / SERVER,
            gguf,
            threads,
            target.max_positions or 4096,
            [],
            label=row,
            flash_attn=target.flash_attn,
        )
        for row, folder in folders.items()
    }
    return servers, None


def _server_summary(rows: list[dict], server, row: str) -> dict | None:
    """A llama-server row's binary and the tok/s of our plain decoding and of the bare loop relative to its own (the
    default build's: the static build's too)."""
    if server is None:
        return None
    tok_s = {r["runner"]: r["tok_s"] for r in rows}
    ours = tok_s.get("autoregressive")
    summary = {
        "binary": Path(server.args[0]).name,
        "autoregressive_vs_server": ours / tok_s[row] if ours is not None else None,
        "bare_vs_server": tok_s[BARE] / tok_s[row],
    }
    if row == DEFAULT_BUILD_ROW:
        summary["static_vs_default"] = tok_s[SERVER_ROW] / tok_s[row]
    return summary
