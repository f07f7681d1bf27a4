"""`draftverify bench serve-llamacpp`: our server on the llama.cpp backend against llama.cpp's own `llama-server`,
on the same GGUF files, at the same concurrency.

For every answer length and every client count C, every server (ours per method, llama-server per spec type) is
started fresh with room for C requests at once (ours `--max-batch C`, llama-server `--parallel C`), all of them up
together, each warmed up and asked every prompt alone (the single-request texts). Then, `rounds` times, each in turn
is loaded by C streaming clients for C x `per_client` requests (load_test.run), the order rotated every round, so a
drift of the machine's speed falls on every server alike. The report gives each server's throughput (completion
tokens over the wall time) in the round with the median throughput and in every round, p50 / p99 latency, how many
answers equal the same request sent alone, how many single-request texts equal llama-server's plain ones, and the
throughput at C over the throughput at one client. Greedy throughout; one server is loaded at a time, the others
idle, so each has the whole CPU.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..errors import DraftVerifyError
from ..markdown import markdown_table
from .load_test import PROMPTS, agreement, references, run, spawn, summary

NATIVE_BODY = {"cache_prompt": False}  # llama-server: every request prefills its prompt, as ours does
MAX_CLIENTS = 64


@dataclass(frozen=True)
class ServerSpec:
    """One server of the comparison: ours with a method, or llama-server with a native spec row."""

    name: str
    kind: str  # "ours" or "native"
    method: str | None = None  # ours
    gamma: str | None = None  # ours: the draft length (None: --gamma's)
    native: object | None = None  # native: a native_spec.NativeSpec


def parse_list(text: str, flag: str, kind: type = int, low: int = 1, high: int | None = None) -> list:
    """'1,4,8' -> [1, 4, 8] or a one-line error naming the flag."""
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DraftVerifyError(f"{flag} takes a comma list of integers, got {text!r}") from None
    if not values or any(v < low or (high is not None and v > high) for v in values):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise DraftVerifyError(f"{flag}: every value must be in {bound}, got {text!r}")
    return values


def server_specs(methods: str, native: list[str]) -> list[ServerSpec]:
    """The servers to compare: ours for each method of --methods (METHOD, or METHOD[GAMMA] with a draft length of
    its own), llama-server for each --native row."""
    from ..draft_length import parse_gamma
    from ..methods import resolve_method
    from .native_spec import FAMILY, parse_spec

    specs = []
    for entry in [m.strip() for m in methods.split(",") if m.strip()]:
        match = re.fullmatch(r"([A-Za-z0-9_]+)(?:\[([^\]]+)\])?", entry)
        if match is None:
            raise DraftVerifyError(f"--methods entry {entry!r}: write METHOD or METHOD[GAMMA], e.g. model[16]")
        method, gamma = match.groups()
        resolve_method(method)
        if gamma is not None:
            parse_gamma(int(gamma) if gamma.isdigit() else gamma)
        specs.append(ServerSpec(f"ours:{entry}", "ours", method=method, gamma=gamma))
    for row in native or ["plain"]:
        spec = parse_spec(row if row.startswith(FAMILY) else f"{FAMILY}[{row}]")
        if spec.eagle3:
            raise DraftVerifyError(f"--native {row!r}: draft-eagle3 is not offered here; use `draftverify bench speed`")
        specs.append(ServerSpec(spec.name, "native", native=spec))
    if not any(s.kind == "ours" for s in specs):
        raise DraftVerifyError("--methods names no method of ours")
    return specs


class Models:
    """The GGUF files both servers read: the target at its type, the draft (and aligned draft) at the draft's."""

    def __init__(self, zoo: str | None, target: str | None, draft: str | None, target_gguf: str, draft_gguf: str):
        from ..api import zoo_paths
        from ..backends.gguf import gguf_for, llama_cpp_dir

        paths = zoo_paths(zoo) if zoo else {}
        target = target or paths.get("target")
        if target is None:
            raise DraftVerifyError("no model: give --zoo NAME or --target PATH")
        draft = draft or paths.get("draft")
        source = llama_cpp_dir()
        self.target = self._gguf(target, target_gguf, source, gguf_for)
        self.draft = self._gguf(draft, draft_gguf, source, gguf_for) if draft else None

    @staticmethod
    def _gguf(path, outtype: str, source, gguf_for) -> Path:
        path = Path(path)
        if path.suffix == ".gguf":
            return path
        return gguf_for(path, outtype, source)


def our_server(spec: ServerSpec, models: Models, clients: int, threads: int, gamma: str):
    """`draftverify serve` on the llama.cpp backend with room for `clients` rows; (process, url)."""
    from ..methods import resolve_method

    args = ["--target", str(models.target), "--backend", "llamacpp", "--method", spec.method]
    args += ["--max-batch", str(clients), "--threads", str(threads), "--gamma", spec.gamma or gamma, "--no-heal"]
    if resolve_method(spec.method).needs_draft:
        if models.draft is None:
            raise DraftVerifyError(f"method {spec.method!r} needs a draft: give --draft or a zoo that has one")
        args += ["--draft", str(models.draft)]
    return spawn(shlex.join(args))


def native_server(spec: ServerSpec, models: Models, clients: int, threads: int, n_ctx: int):
    """llama-server with `clients` slots on the same files; (server, url)."""
    from ..backends.gguf import SERVER, tools_dir
    from .llamacpp_native import NativeServer

    native = spec.native
    draft = models.draft if native.needs_draft else None
    if native.needs_draft and draft is None:
        raise DraftVerifyError(f"{spec.name} needs a draft: give --draft or a zoo that has one")
    server = NativeServer(
        tools_dir() / SERVER,
        models.target,
        threads,
        n_ctx * clients,
        native.server_args(draft, threads),
        label=spec.name,
        parallel=clients,
    )
    return server, f"http://127.0.0.1:{server.port}"


@dataclass
class Running:
    """A started server of one cell: where it answers, what its requests add, how it stops, what it has answered."""

    spec: ServerSpec
    url: str
    extra: dict
    close: Callable[[], object]
    model: str = ""
    alone: dict | None = None
    rounds: list[tuple[list[dict], float]] = field(default_factory=list)  # per round: (results, wall seconds)


def prepare(server: Running, clients: int, max_tokens: int, duration: float) -> None:
    """Warm-up, then every prompt alone (the single-request texts)."""
    server.model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    asyncio.run(run(server.url, server.model, clients, clients, duration, max_tokens, None, extra=server.extra))
    server.alone = asyncio.run(references(server.url, server.model, max_tokens, None, False, extra=server.extra))


def load(server: Running, clients: int, per_client: int, max_tokens: int, duration: float) -> None:
    """One round: C clients, C x per_client requests."""
    results, wall, _ = asyncio.run(
        run(server.url, server.model, clients, clients * per_client, duration, max_tokens, None, extra=server.extra)
    )
    server.rounds.append((results, wall))


def cell_of(server: Running, clients: int) -> dict:
    """The round with the median throughput (its latencies too), every round's throughput, and how many answers of
    every round equal the same request alone."""
    summaries = [summary(results, wall, [], 0, clients) for results, wall in server.rounds]
    order = sorted(range(len(summaries)), key=lambda i: summaries[i]["tokens_per_second"] or 0)
    cell = dict(summaries[order[len(order) // 2]])
    cell["rounds_tokens_per_second"] = [s["tokens_per_second"] for s in summaries]
    assert server.alone is not None  # set by prepare
    cell.update(agreement([r for results, _ in server.rounds for r in results], server.alone))
    for key in [k for k in cell if k.startswith("rss")]:
        del cell[key]
    cell["alone"] = {prompt: text for (prompt, _), text in server.alone.items()}
    return cell


def run_comparison(
    zoo: str | None,
    target: str | None,
    draft: str | None,
    methods: str,
    native: list[str],
    clients_text: str,
    max_tokens_text: str,
    per_client: int,
    gamma: str,
    threads: int,
    target_gguf: str,
    draft_gguf: str,
    duration: float,
    out: Path | None,
    command: str,
    echo,
    rounds: int = 1,
) -> dict:
    """Every (answer length, client count, server) cell; the report (written to out as JSON and markdown)."""
    from ..backends import check_draft_gguf, check_gguf_type
    from ..draft_length import parse_gamma

    clients_list = parse_list(clients_text, "--clients", high=MAX_CLIENTS)
    lengths = parse_list(max_tokens_text, "--max-tokens", high=4096)
    if per_client < 1:
        raise DraftVerifyError(f"--per-client must be >= 1, got {per_client}")
    if not 1 <= rounds <= 20:
        raise DraftVerifyError(f"--rounds must be in 1..20, got {rounds}")
    if threads < 1:
        raise DraftVerifyError(f"--threads must be >= 1, got {threads}")
    if not 0 < duration <= 3600:
        raise DraftVerifyError(f"--duration must be in (0, 3600] seconds, got {duration}")
    parse_gamma(int(gamma) if gamma.isdigit() else gamma)
    check_gguf_type(target_gguf, "--target-gguf", "target")
    check_draft_gguf(draft_gguf)
    specs = server_specs(methods, native)
    models = Models(zoo, target, draft, target_gguf, draft_gguf)
    n_ctx = max(lengths) + 512  # a slot's room: the longest answer and the prompt
    cells = []
    for max_tokens in lengths:
        for clients in clients_list:
            servers: list[Running] = []
            try:
                for spec in specs:  # every server of the cell up at once, idle but for its own load
                    if spec.kind == "ours":
                        proc, url = our_server(spec, models, clients, threads, gamma)
                        servers.append(Running(spec, url, {}, lambda p=proc: (p.terminate(), p.wait(30))))
                    else:
                        server, url = native_server(spec, models, clients, threads, n_ctx)
                        servers.append(Running(spec, url, NATIVE_BODY, server.close))
                for server in servers:
                    echo(f"{server.spec.name}: {clients} client(s), {max_tokens} tokens: warm-up, prompts alone")
                    prepare(server, clients, max_tokens, duration)
                for index in range(rounds):  # the servers in turn, the order rotated each round
                    for server in servers[index % len(servers) :] + servers[: index % len(servers)]:
                        echo(f"{server.spec.name}: {clients} client(s), {max_tokens} tokens: round {index + 1}")
                        load(server, clients, per_client, max_tokens, duration)
            finally:
                for server in servers:
                    server.close()
            cells += [{"server": s.spec.name, "max_tokens": max_tokens, **cell_of(s, clients)} for s in servers]
    report = {
        "command": command,
        "target_gguf": models.target.name,
        "draft_gguf": models.draft.name if models.draft else None,
        "threads": threads,
        "gamma": gamma,
        "per_client": per_client,
        "rounds": rounds,
        "prompts": len(PROMPTS),
        "cells": cells,
        "scaling": scaling(cells),
        "versus": versus(cells),
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(report))
    return report


def scaling(cells: list[dict]) -> list[dict]:
    """Each server's throughput at C clients over its throughput at the smallest C, per answer length."""
    rows = []
    for cell in cells:
        base = min(
            (c for c in cells if c["server"] == cell["server"] and c["max_tokens"] == cell["max_tokens"]),
            key=lambda c: c["clients"],
        )
        if base["tokens_per_second"] and cell["tokens_per_second"] is not None:
            rows.append(
                {
                    "server": cell["server"],
                    "max_tokens": cell["max_tokens"],
                    "clients": cell["clients"],
                    "over_clients": base["clients"],
                    "ratio": round(cell["tokens_per_second"] / base["tokens_per_second"], 2),
                }
            )
    return rows


def paired(ours: dict, theirs: dict) -> list[float]:
    """Round by round, ours over theirs: the two loads of a round ran minutes apart at most, so each ratio sees
    the same host speed, which drifts by more between rounds than the servers differ."""
    pairs = zip(ours.get("rounds_tokens_per_second", []), theirs.get("rounds_tokens_per_second", []))
    return [round(a / b, 2) for a, b in pairs if a and b]


def versus(cells: list[dict]) -> list[dict]:
    """Per (answer length, clients): our best server's throughput over llama-server's best (each side's median
    round), the same two servers round by round (`paired`, their median and how many rounds ours led), and how many
    of our single-request texts equal llama-server plain's."""
    rows = []
    for key in sorted({(c["max_tokens"], c["clients"]) for c in cells}):
        here = [c for c in cells if (c["max_tokens"], c["clients"]) == key]
        ours = [c for c in here if c["server"].startswith("ours:")]
        theirs = [c for c in here if not c["server"].startswith("ours:")]
        if not ours or not theirs:
            continue
        best_ours = max(ours, key=lambda c: c["tokens_per_second"] or 0)
        best_theirs = max(theirs, key=lambda c: c["tokens_per_second"] or 0)
        plain = next((c for c in theirs if c["server"].endswith("[plain]")), None)
        row = {
            "max_tokens": key[0],
            "clients": key[1],
            "ours": best_ours["server"],
            "ours_tokens_per_second": best_ours["tokens_per_second"],
            "native": best_theirs["server"],
            "native_tokens_per_second": best_theirs["tokens_per_second"],
            "ratio": round(best_ours["tokens_per_second"] / best_theirs["tokens_per_second"], 2)
            if best_theirs["tokens_per_second"]
            else None,
        }
        if rounds := paired(best_ours, best_theirs):
            row["paired_ratios"] = rounds
            row["paired_median"] = round(statistics.median(rounds), 2)
            row["rounds_ahead"] = f"{sum(r >= 1.0 for r in rounds)}/{len(rounds)}"
        if plain is not None:
            same = sum(plain["alone"].get(p) == t for p, t in best_ours["alone"].items())
            row["alone_equal_native_plain"] = f"{same}/{len(best_ours['alone'])}"
        rows.append(row)
    return rows


def markdown(report: dict) -> str:
    """The report's tables: every cell, the scaling over one client, ours against llama-server."""

    def ms(seconds):
        return "" if seconds is None else f"{seconds * 1000:.0f}"

    lines = [
        "# Our server on llama.cpp against llama-server",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Target `{report['target_gguf']}`"
        + (f", draft `{report['draft_gguf']}`" if report["draft_gguf"] else "")
        + f", {report['threads']} threads, greedy, {report['prompts']} prompts, {report['per_client']} requests per "
        f"client, gamma {report['gamma']}. Per cell every server is started fresh, all of them up at once, each "
        f"loaded alone in turn for {report.get('rounds', 1)} round(s), the order rotated each round; a cell reports "
        "the round with the median throughput.",
        "",
    ]
    cells = [
        (
            c["max_tokens"],
            c["clients"],
            f"`{c['server']}`",
            c["tokens_per_second"],
            " / ".join(str(t) for t in c.get("rounds_tokens_per_second", [c["tokens_per_second"]])),
            c["requests_per_second"],
            f"{ms(c['latency_p50_s'])} / {ms(c['latency_p99_s'])}",
            c.get("greedy_equal_single", "-"),
            ", ".join(f"{k}: {v}" for k, v in c["errors"].items()) or "none",
        )
        for c in report["cells"]
    ]
    lines += markdown_table(
        (
            "max tokens",
            "clients",
            "server",
            "tokens/s",
            "every round's tokens/s",
            "requests/s",
            "latency p50 / p99 ms",
            "equal to alone",
            "errors",
        ),
        cells,
        "rrlrrrrrl",
    )
    versus = [
        (
            v["max_tokens"],
            v["clients"],
            f"`{v['ours']}`",
            v["ours_tokens_per_second"],
            f"`{v['native']}`",
            v["native_tokens_per_second"],
            f"{v['ratio']}x",
            " / ".join(f"{r}x" for r in v.get("paired_ratios", [])) or "-",
            f"{v['paired_median']}x" if "paired_median" in v else "-",
            v.get("rounds_ahead", "-"),
            v.get("alone_equal_native_plain", "-"),
        )
        for v in report["versus"]
    ]
    lines += ["", "## Ours against llama-server (best of each side)", ""]
    lines += markdown_table(
        (
            "max tokens",
            "clients",
            "ours",
            "tokens/s",
            "llama-server",
            "tokens/s",
            "ours / theirs",
            "round by round",
            "median of rounds",
            "rounds ours led",
            "texts equal to llama-server plain",
        ),
        versus,
        "rrlrlrrrrrr",
    )
    scaling = [
        (s["max_tokens"], f"`{s['server']}`", s["clients"], s["over_clients"], f"{s['ratio']}x")
        for s in report["scaling"]
        if s["clients"] != s["over_clients"]
    ]
    lines += ["", "## Throughput over the fewest clients", ""]
    lines += markdown_table(("max tokens", "server", "clients", "over clients", "ratio"), scaling, "rlrrr")
    return "\n".join(lines) + "\n"
