"""llama.cpp's own C++ speculative decoding as a peer: the `llamacpp_native[...]` rows.

The engine a CPU user would pick is llama.cpp itself, not a Python binding: these rows drive the vendored
`llama-server` (built by scripts/build_llama_cpp_tools.sh from the source the `llamacpp` extra installs), one
server per row, on the same GGUF files our llama.cpp rows run (the target at --target-gguf or --dtype, drafts at
--draft-gguf, converted once and cached by backends/gguf.py). Each prompt goes to `/completion` as the same token
ids every other row gets, greedy, `n_predict` = max new tokens (the server drafts at most what is left, so a row
stops exactly at N), no prompt cache. The row's time is llama.cpp's own `timings` (prompt_ms + predicted_ms: the
prefill and the generation, the span our rows time), without the HTTP round trip; the wall time of the request is
kept beside it in the per-prompt record.

A row spec names llama.cpp's `--spec-type` list and a few of its settings:
`llamacpp_native[plain]`, `llamacpp_native[draft-simple,n_max=16,p_min=0.75,draft=aligned]`,
`llamacpp_native[ngram-mod]`, `llamacpp_native[ngram-mod,draft-simple]`; a bare `llamacpp_native` runs DEFAULT_SPECS.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from ..backends.gguf import BUILD_SCRIPT, SERVER, TOOLS_ENV, tools_dir  # noqa: F401  (TOOLS_ENV, BUILD_SCRIPT: read by tests)
from ..backends.llamacpp import cpu_has_amx
from ..backends.llamacpp_kernels import FLASH_ATTENTION, peer_environment
from ..errors import DraftVerifyError
from .load_test import free_port
from .native_spec import DRAFT_ROLES, FAMILY, NativeSpec, native_specs
from .runners import Measurement, Runner

START_TIMEOUT = 180.0  # seconds for a server to load its models and answer /health
REQUEST_TIMEOUT = 600.0
PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """In the server's process before it runs (Linux): a SIGTERM when the bench's process dies, even by a crash that
    skips its atexit handlers, so no server outlives the run."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class NativeServer:
    """One llama-server on a loopback port: `parallel` slots (one for the bench rows), its log in a temporary file."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        threads: int,
        n_ctx: int,
        extra: list[str],
        label: str,
        parallel: int = 1,
        flash_attn: bool = FLASH_ATTENTION,
        ignore_eos: bool = False,
    ):
        self.label = label
        self.ignore_eos = ignore_eos  # every request generates n_predict tokens (random-weight models: bench synthetic)
        self._start(binary, model, threads, n_ctx, extra, parallel, flash_attn)

    def _start(
        self, binary: Path, model: Path, threads: int, n_ctx: int, extra: list[str], parallel: int, flash_attn: bool
    ) -> None:
        self.start_args = (binary, model, threads, n_ctx, extra, parallel, flash_attn)
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.args = [
            str(binary),
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(parallel),
            "--threads",
            str(threads),
            "--threads-batch",
            str(threads),
            "--ctx-size",
            str(n_ctx),
            "--flash-attn",
            "on" if flash_attn else "off",  # as our llama.cpp backend and the llama-cpp-python peers run
            "--cache-ram",
            "0",  # no prompt kept across requests: every request prefills its whole prompt, as every other row
            "--no-ui",
            # the weights in plain CPU buffers on an AMX CPU, as our backend keeps them (backends/llamacpp.cpu_has_amx:
            # llama.cpp's AMX matmul crashes on the zoo's q8_0 draft)
            *(["--no-repack"] if cpu_has_amx() else []),
            *extra,
        ]
        self.process = subprocess.Popen(
            self.args,
            env=peer_environment(),  # llama.cpp's own kernels, not the exact ones our rows may have asked for
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        atexit.register(self.close)
        self._wait_ready()

    def _tail(self) -> str:
        lines = [line.strip() for line in Path(self.log.name).read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][-300:] if lines else "no output"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self._tail()
                self.close()
                raise DraftVerifyError(f"{self.label}: {SERVER} exited ({self.process.returncode}): {tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self._tail()
        self.close()
        raise DraftVerifyError(f"{self.label}: {SERVER} did not answer within {START_TIMEOUT:.0f} s: {tail}")

    def complete(self, prompt: list[int], n_predict: int, seed: int | None = None) -> dict:
        """POST /completion: greedy, at most n_predict tokens after the prompt's token ids, no prompt cache; `seed`:
        the request's own (a synthetic-acceptance server seeds its draws with it), else the server draws one."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
            "ignore_eos": self.ignore_eos,
        }
        if seed is not None:
            body["seed"] = seed
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            raise DraftVerifyError(f"{self.label}: {SERVER} answered {err.code}: {err.read()[:300]!r}") from None
        except urllib.error.URLError as err:
            raise DraftVerifyError(f"{self.label}: {SERVER} is unreachable ({err.reason}): {self._tail()}") from None

    def restart(self) -> None:
        """A fresh server with the same arguments: nothing the last one learnt from its requests is kept."""
        self.close()
        self._start(*self.start_args)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)
        atexit.unregister(self.close)


def measurement(reply: dict, max_new_tokens: int, wall_seconds: float) -> Measurement:
    """A /completion reply -> Measurement. Target calls: the prompt's call emits the first token, each later call
    one token plus the drafts it accepted, so calls = predicted_n - draft_n_accepted."""
    timings = reply["timings"]
    tokens = [int(t) for t in reply["tokens"]]
    drafted = int(timings.get("draft_n", 0))
    accepted = int(timings.get("draft_n_accepted", 0))
    produced = int(timings["predicted_n"])
    return Measurement(
        new_ids=tokens[:max_new_tokens],
        seconds=(timings["prompt_ms"] + timings["predicted_ms"]) / 1000,
        target_calls=max(1, produced - accepted),
        draft_calls=0,  # the server does not count its draft model's forwards
        drafted=drafted,
        accepted=accepted,
        rejections=drafted - accepted,  # alpha = accepted / drafted, llama.cpp's own acceptance rate
        stats={"native_timings": timings, "wall_seconds": wall_seconds},
        overshoot=max(0, len(tokens) - max_new_tokens),
    )


@dataclass
class NativeRunner(Runner):
    """One llama-server per row; each prompt one greedy /completion request."""

    server: NativeServer | None = None

    def run(self, input_ids, temperature, seed, max_new_tokens) -> Measurement:
        if temperature > 0:
            raise DraftVerifyError("the llama.cpp rows run greedy only")
        started = perf_counter()
        prompt = input_ids[0].tolist()
        reply = self.server.complete(prompt, max_new_tokens, self.request_seed(prompt))
        return measurement(reply, max_new_tokens, perf_counter() - started)

    def request_seed(self, prompt: list[int]) -> int | None:
        """The seed a request carries (None: the server's own; bench synthetic seeds its draws)."""
        return None

    def new_round(self) -> None:
        self.server.restart()

    def close(self) -> None:
        self.server.close()


def native_runners(config, models, reference: str | None = None) -> tuple[list[Runner], list[str]]:
    """The `llamacpp_native[...]` rows --runners names (each with its server started), or none and a note saying
    why. Their greedy text is compared with `reference` (llama-cpp-python's plain row when it runs), else with
    `llamacpp_native[plain]` when that runs, else with hf_generate."""
    specs = native_specs(config.runners)
    if not specs:
        return [], []
    plain = NativeSpec()
    if reference is None and plain in specs:
        reference = plain.name
    import torch

    from ..backends.gguf import gguf_for, llama_cpp_dir
    from .models import method_options

    try:
        folder = tools_dir()
        source = llama_cpp_dir()
        target = gguf_for(models.paths["target"], config.target_gguf_type(), source)
    except DraftVerifyError as err:
        return [], [f"{FAMILY} rows skipped: {err}"]
    threads = config.threads or torch.get_num_threads()
    n_ctx = models.context_limit or 4096
    runners: list[Runner] = []
    notes: list[str] = []
    drafts: dict[str, Path] = {}
    try:
        for spec in specs:
            draft = None
            if spec.eagle3:
                if "eagle3" not in drafts:
                    head = method_options(config)[0].get("eagle3_path")
                    if head is None:
                        notes.append(f"{spec.name} skipped: no EAGLE-3 head (pass --eagle3 or a zoo that has one)")
                        continue
                    drafts["eagle3"] = gguf_for(head, "f16", source, target_dir=models.paths["target"])
                draft = drafts["eagle3"]
            elif spec.needs_draft:
                role = DRAFT_ROLES[spec.draft]
                if not models.paths.get(role):
                    notes.append(f"{spec.name} skipped: no {role.replace('_', ' ')} model")
                    continue
                if role not in drafts:
                    drafts[role] = gguf_for(models.paths[role], config.draft_gguf, source)
                draft = drafts[role]
            server = NativeServer(
                folder / SERVER,
                target,
                threads,
                n_ctx,
                spec.server_args(draft, threads),
                label=spec.name,
                flash_attn=config.llamacpp_flash_attn(),
            )
            settings = {"gguf": target.name, "threads": threads, "spec_type": ",".join(spec.types) or "none"}
            settings.update({k: v for k, v in (("n_max", spec.n_max), ("p_min", spec.p_min)) if v is not None})
            if draft is not None:
                settings["draft_gguf"] = draft.name
            runners.append(
                NativeRunner(
                    spec.name,
                    FAMILY,
                    group=spec.group,
                    greedy_only=True,
                    lossless=False,
                    reference=reference if reference != spec.name else None,
                    settings=settings,
                    server=server,
                )
            )
    except DraftVerifyError as err:
        for runner in runners:
            runner.close()
        return [], notes + [f"{FAMILY} rows skipped: {err}"]
    notes.append(
        f"{FAMILY} rows: llama.cpp's own {SERVER} ({folder}), one per row, on the target GGUF {target.name}"
        + (f" and draft GGUFs at {config.draft_gguf}" if set(drafts) - {"eagle3"} else "")
        + (" and the EAGLE-3 head's GGUF at f16" if "eagle3" in drafts else "")
        + f", {threads} threads"
        + (", weights in plain CPU buffers (--no-repack, as our backend on an AMX CPU)" if cpu_has_amx() else "")
        + ", greedy, n_predict = max new tokens, no prompt cache (the ngram drafters keep what earlier requests "
        "taught them, as a server does); tok/s from the server's "
        "timings (prompt_ms + predicted_ms); tokens/call = predicted_n / (predicted_n - draft_n_accepted); "
        "alpha = draft_n_accepted / draft_n; '= baseline' against " + (f"`{reference}`" if reference else "hf_generate")
    )
    return runners, notes
