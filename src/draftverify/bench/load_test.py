"""`draftverify bench serve`: a bounded loopback load test of `draftverify serve`: N concurrent streaming clients
for a fixed time or a fixed number of requests, whichever ends first; reports throughput, p50/p99 latency and time
to first token, errors, and the server's resident memory (RSS): sampled every rss_every completed requests, so
growth after warm-up (the last sample minus the first at or after rss_warm requests: the allocator's and caches'
first fill is over) tells a leak from warm-up, which before-minus-after cannot. With out it also writes a markdown
report next to the JSON (its tables go into docs/serving.md through `draftverify docs tables`).

Only loopback addresses are accepted (127.0.0.0/8, localhost, ::1), the request count and the duration are
capped, and the run stops by itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from ..errors import DraftVerifyError
from ..markdown import markdown_table

PROMPTS = [
    "def quicksort(xs):\n    ",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "for i in range(10):\n    ",
    "def read_json(path):\n    with open(path) as f:\n",
]
MAX_REQUESTS = 100_000
MAX_DURATION = 3600.0


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise DraftVerifyError(
        f"refusing {url!r}: the load test only targets loopback addresses (127.0.0.0/8, localhost, ::1)"
    )


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


SAMPLED = {"temperature": 0.8, "top_p": 0.95}  # --mixed: every other request samples with these (and a seed)
SEEDS = 4  # --mixed: sampled requests take seeds 0..SEEDS-1, so each (prompt, seed) has a single-request reference


def settings(index: int, mixed: bool) -> dict:
    """Request `index`'s sampling settings: greedy, or with --mixed every odd request seeded sampling."""
    if not mixed or index % 2 == 0:
        return {"temperature": 0}
    return {**SAMPLED, "seed": (index // 2) % SEEDS}


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    api_key: str | None,
    sampling: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """One streaming completion; extra: server-specific body fields, kept out of the request's key."""
    sampling = sampling if sampling is not None else {"temperature": 0}
    body = {
        **(extra or {}),
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.perf_counter()
    first = None
    tokens = 0
    text: list[str] = []
    for attempt in range(2):  # a keep-alive connection the server closed before answering: once more on a new one
        try:
            async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    await r.aread()
                    return {"ok": False, "status": r.status_code, "seconds": time.perf_counter() - started}
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return {"ok": False, "status": "stream-error", "seconds": time.perf_counter() - started}
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        text.append(chunk["choices"][0]["text"])
                        if first is None:
                            first = time.perf_counter() - started
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            break
        except httpx.RemoteProtocolError as err:
            if attempt or text:
                return {"ok": False, "status": type(err).__name__, "seconds": time.perf_counter() - started}
        except httpx.HTTPError as err:
            return {"ok": False, "status": type(err).__name__, "seconds": time.perf_counter() - started}
    return {
        "ok": True,
        "seconds": time.perf_counter() - started,
        "ttft": first,
        "tokens": tokens,
        "text": "".join(text),
        "key": [prompt, json.dumps(sampling, sort_keys=True)],
    }


async def references(
    url: str, model: str, max_tokens: int, api_key: str | None, mixed: bool, extra: dict | None = None
) -> dict:
    """Each (prompt, settings) pair's text as a single request on the idle server, one request at a time."""
    out = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        for prompt in PROMPTS:
            for index in range(2 * SEEDS if mixed else 1):
                r = await one_request(client, url, model, prompt, max_tokens, api_key, settings(index, mixed), extra)
                if r["ok"]:
                    out[tuple(r["key"])] = r["text"]
    return out


def agreement(results: list[dict], refs: dict) -> dict:
    """How many answered requests equal their single-request text, greedy and sampled apart."""
    counts = {"greedy": [0, 0], "sampled": [0, 0]}
    for r in results:
        if not r["ok"] or tuple(r["key"]) not in refs:
            continue
        kind = "greedy" if json.loads(r["key"][1])["temperature"] == 0 else "sampled"
        counts[kind][1] += 1
        counts[kind][0] += r["text"] == refs[tuple(r["key"])]
    return {f"{kind}_equal_single": f"{same}/{total}" for kind, (same, total) in counts.items() if total}


async def run(
    url: str,
    model: str,
    clients: int,
    requests: int,
    duration: float,
    max_tokens: int,
    api_key: str | None,
    pid: int | None = None,
    rss_every: int = 0,
    mixed: bool = False,
    extra: dict | None = None,
) -> tuple[list[dict], float, list[dict]]:
    """Returns the requests' results, the wall time, and the server's RSS every rss_every completed requests
    (with pid; from 0 completed, and at the end)."""
    results: list[dict] = []
    issued = 0
    deadline = time.perf_counter() + duration
    started = time.perf_counter()
    samples: list[dict] = []

    def sample() -> None:
        rss = rss_mib(pid)
        if rss is not None:
            samples.append(
                {"requests": len(results), "seconds": round(time.perf_counter() - started, 2), "rss_mib": round(rss, 1)}
            )

    async def client_loop(index: int, client: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() < deadline:
            prompt = PROMPTS[(issued + index) % len(PROMPTS)]
            sampling = settings(issued, mixed)
            issued += 1
            results.append(await one_request(client, url, model, prompt, max_tokens, api_key, sampling, extra))
            if rss_every and len(results) % rss_every == 0:
                sample()

    sample()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        await asyncio.gather(*(client_loop(i, client) for i in range(clients)))
    wall = time.perf_counter() - started
    if not samples or samples[-1]["requests"] != len(results):
        sample()
    return results, wall, samples


def rss_growth(samples: list[dict], warm: int) -> dict:
    """RSS growth over the run, and after warm-up: the last sample minus the first one taken at or after `warm`
    completed requests (None when the run ended before that)."""
    if not samples:
        return {"rss_growth_mib": None, "rss_warm_sample": None, "rss_growth_after_warmup_mib": None}
    first, last = samples[0], samples[-1]
    warmed = next((x for x in samples if x["requests"] >= warm), None)
    after = None if warmed is None or warmed is last else round(last["rss_mib"] - warmed["rss_mib"], 1)
    return {
        "rss_growth_mib": round(last["rss_mib"] - first["rss_mib"], 1),
        "rss_warm_sample": warmed,
        "rss_growth_after_warmup_mib": after,
    }


def sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    return "".join(bars[0 if high == low else round((v - low) / (high - low) * (len(bars) - 1))] for v in values)


def markdown(report: dict) -> str:
    """The report as markdown: a summary table and the RSS series (table and sparkline)."""

    def ms(seconds):
        return "" if seconds is None else f"{seconds * 1000:.0f}"

    def mib(value):
        return "" if value is None else f"{value:+.1f}"

    errors = ", ".join(f"{k}: {v}" for k, v in report["errors"].items()) or "none"
    samples = report["rss_samples"]
    warm = report["rss_warm_sample"]
    kind = "greedy and seeded sampling (temperature 0.8, top-p 0.95) alternating" if report.get("mixed") else "greedy"
    title = f"# Load test ({report['clients']} streaming clients, {report['max_tokens']} tokens per request, {kind})"
    lines = [
        title,
        "",
        f"Command: `{report['command']}`",
        "",
        "## Summary",
        "",
        *markdown_table(
            (
                "requests",
                "answered",
                "errors",
                "tokens/s",
                "requests/s",
                "latency p50 / p99 ms",
                "first token p50 / p99 ms",
                "RSS first -> last sample MiB",
                "growth MiB",
                "growth after warm-up MiB",
            ),
            [
                (
                    report["requests"],
                    report["ok"],
                    errors,
                    report["tokens_per_second"],
                    report["requests_per_second"],
                    f"{ms(report['latency_p50_s'])} / {ms(report['latency_p99_s'])}",
                    f"{ms(report['ttft_p50_s'])} / {ms(report['ttft_p99_s'])}",
                    f"{samples[0]['rss_mib']:.1f} -> {samples[-1]['rss_mib']:.1f}" if samples else "",
                    mib(report["rss_growth_mib"]),
                    mib(report["rss_growth_after_warmup_mib"]),
                )
            ],
            "rrlrrrrrrr",
        ),
        "",
    ]
    if report.get("mixed"):
        lines += [
            "Every answered request against the same prompt and settings sent alone to the idle server first "
            "(each row of a batch must equal its single-request text):",
            "",
            *markdown_table(
                ("greedy equal to single request", "seeded sampling equal to single request"),
                [(report.get("greedy_equal_single", "-"), report.get("sampled_equal_single", "-"))],
                "rr",
            ),
            "",
        ]
    if samples:
        lines += [
            "## Resident memory",
            "",
            f"The server's RSS every {report['rss_every']} completed requests; growth after warm-up is the last "
            f"sample minus the first at or after {report['rss_warm']} requests"
            + (
                f" ({warm['requests']} requests, {warm['rss_mib']:.1f} MiB)." if warm else " (the run ended before it)."
            ),
            "",
            f"`{sparkline([x['rss_mib'] for x in samples])}` {samples[0]['rss_mib']:.1f} -> "
            f"{samples[-1]['rss_mib']:.1f} MiB",
            "",
        ]
        warm_at = float("inf") if warm is None else warm["requests"]
        rows = [
            (
                x["requests"],
                f"{x['seconds']:.1f}",
                f"{x['rss_mib']:.1f}",
                f"{x['rss_mib'] - warm['rss_mib']:+.1f}" if x["requests"] >= warm_at else "",
            )
            for x in samples
        ]
        lines += markdown_table(("requests completed", "seconds", "RSS MiB", "vs warm-up sample MiB"), rows, "rrrr")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server this process starts (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "draftverify.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *shlex.split(args),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DraftVerifyError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.terminate()
    raise DraftVerifyError("the server did not become healthy within 300 s")


def summary(results: list[dict], wall: float, samples: list[dict], warm: int, clients: int) -> dict:
    ok = [r for r in results if r["ok"]]
    latencies = [r["seconds"] for r in ok]
    ttfts = [r["ttft"] for r in ok if r.get("ttft") is not None]
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            errors[str(r["status"])] = errors.get(str(r["status"]), 0) + 1
    tokens = sum(r.get("tokens", 0) for r in ok)
    return {
        "clients": clients,
        "requests": len(results),
        "ok": len(ok),
        "errors": errors,
        "wall_seconds": round(wall, 3),
        "requests_per_second": round(len(ok) / wall, 3) if wall else None,
        "tokens": tokens,
        "tokens_per_second": round(tokens / wall, 2) if wall else None,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "rss_before_mib": samples[0]["rss_mib"] if samples else None,
        "rss_after_mib": samples[-1]["rss_mib"] if samples else None,
        **rss_growth(samples, warm),
        "rss_samples": samples,
    }


def run_load_test(
    url: str | None = None,
    spawn_args: str | None = None,
    model: str | None = None,
    pid: int | None = None,
    api_key: str | None = None,
    clients: int = 8,
    requests: int = 1000,
    duration: float = 300.0,
    max_tokens: int = 64,
    warmup: int = 4,
    rss_every: int = 100,
    rss_warm: int = 200,
    mixed: bool = False,
    out: Path | None = None,
    command: str = "",
) -> dict:
    """Run the load test (against url, or a server started with spawn_args); the report, with "passed": every
    request answered and, with mixed, every answer equal to its request sent alone."""
    if (url is None) == (spawn_args is None):
        raise DraftVerifyError("give exactly one of --url and --spawn")
    if not 1 <= clients <= 256 or not 1 <= requests <= MAX_REQUESTS or not 0 < duration <= MAX_DURATION:
        raise DraftVerifyError(
            f"--clients 1..256, --requests 1..{MAX_REQUESTS}, --duration (0, {MAX_DURATION:.0f}] seconds"
        )
    if rss_every < 1 or rss_warm < 0:
        raise DraftVerifyError("--rss-every must be >= 1 and --rss-warm >= 0")
    proc = None
    if spawn_args is not None:
        proc, url = spawn(spawn_args)
        pid = proc.pid
    assert url is not None
    try:
        check_loopback(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        model = model or httpx.get(url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        if warmup:
            asyncio.run(run(url, model, min(clients, warmup), warmup, duration, max_tokens, api_key))
        refs = asyncio.run(references(url, model, max_tokens, api_key, mixed))
        results, wall, samples = asyncio.run(
            run(url, model, clients, requests, duration, max_tokens, api_key, pid, rss_every, mixed)
        )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    report = {
        "command": command,
        "url": url,
        "model": model,
        "max_tokens": max_tokens,
        "rss_every": rss_every,
        "rss_warm": rss_warm,
        "mixed": mixed,
        **agreement(results, refs),
        **summary(results, wall, samples, rss_warm, clients),
    }
    text = json.dumps(report, indent=1)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        out.with_suffix(".md").write_text(markdown(report))
    agreed = all(a == b for a, b in (v.split("/") for k, v in report.items() if k.endswith("_equal_single")))
    report["passed"] = report["ok"] == report["requests"] and agreed
    return report
