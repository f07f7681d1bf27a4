"""Our fastest llama.cpp-backend row against llama.cpp's own decoding, over several rounds in one process, so the
head-to-head ratio comes with its spread (one bench run on a shared machine moves llama.cpp's rows by about 10%).

Each round runs every prompt through every row, the rows' order rotated per prompt; a round's ratio is our tok/s
over the peer's in that round. The peers are the bench's own runners (bench/llamacpp.py): llama.cpp plain and prompt
lookup at llama-cpp-python's defaults (`LlamaPromptLookupDecoding()`), on the same f32 GGUF of the zoo target.
Our text must equal llama.cpp's plain greedy text on every prompt; a difference stops the script.

Usage: python scripts/llamacpp_duel.py [--method model] [--gamma conf] [--prompts 8] [--rounds 5]
Writes benchmarks/llamacpp-duel.md (and prints it)."""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from draftverify import DraftVerifyError, SamplingParams, load
from draftverify.api import zoo_paths
from draftverify.backends.gguf import gguf_for
from draftverify.bench.environment import machine, now
from draftverify.bench.llamacpp import EvalCounter, LlamaCppRunner
from draftverify.bench.prompts import default_data_dir, load_humaneval

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
THREADS = 2


def peers(eos: int) -> dict[str, LlamaCppRunner]:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    gguf = str(gguf_for(zoo_paths("code")["target"], "f32"))
    common = dict(n_ctx=2048, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    plain = Llama(model_path=gguf, **common)
    lookup = LlamaPromptLookupDecoding()
    looked = Llama(model_path=gguf, draft_model=lookup, **common)
    shared = dict(greedy_only=True, lossless=False, eos_token_id=eos)
    return {"llamacpp": LlamaCppRunner("llamacpp", "llamacpp", llm=plain, counter=EvalCounter(plain), **shared),
            "llamacpp_prompt_lookup[default]": LlamaCppRunner(
                "llamacpp_prompt_lookup[default]", "llamacpp_prompt_lookup", llm=looked, counter=EvalCounter(looked),
                lookup=lookup, **shared)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="model")
    ap.add_argument("--gamma", default="conf")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.prompts < 1 or args.rounds < 1:
        ap.exit(2, "error: --prompts and --rounds must be at least 1\n")
    torch.set_num_threads(THREADS)
    try:
        pipe = load(zoo="code", method=args.method, backend="llamacpp", gamma=args.gamma, threads=THREADS)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    ours = f"llamacpp:{args.method}[{args.gamma}]"
    rows = peers(pipe.tokenizer.eos_token_id)
    prompts = [pipe.encode(p.text) for p in load_humaneval(default_data_dir())[: args.prompts]]

    def run_ours(ids: torch.Tensor) -> tuple[list[int], float]:
        started = time.perf_counter()
        out, _ = pipe.generate_ids(ids, SamplingParams(), max_new_tokens=NEW_TOKENS)  # greedy, the same token ids
        return out.new_tokens[0].tolist(), time.perf_counter() - started

    names = [ours, *rows]
    for ids in prompts[:1]:  # warm-up, one generation each
        run_ours(ids)
        for runner in rows.values():
            runner.run(ids, 0.0, 0, NEW_TOKENS)
    per_round = []
    for r in range(args.rounds):
        tokens = dict.fromkeys(names, 0)
        seconds = dict.fromkeys(names, 0.0)
        for i, ids in enumerate(prompts):
            shift = (r * len(prompts) + i) % len(names)
            texts = {}
            for name in names[shift:] + names[:shift]:
                if name == ours:
                    new, took = run_ours(ids)
                else:
                    m = rows[name].run(ids, 0.0, 0, NEW_TOKENS)
                    new, took = m.new_ids, m.seconds
                texts[name] = new
                tokens[name] += len(new)
                seconds[name] += took
            if texts[ours] != texts["llamacpp"]:
                raise SystemExit(f"round {r}, prompt {i}: {ours} differs from llama.cpp's greedy text")
        per_round.append({n: tokens[n] / seconds[n] for n in names})
        print(f"round {r + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in per_round[-1].items()), flush=True)
    lines = []
    for peer in rows:
        ratios = [x[ours] / x[peer] for x in per_round]
        lines.append(f"| `{ours}` | `{peer}` | {statistics.median(x[ours] for x in per_round):.1f} | "
                     f"{statistics.median(x[peer] for x in per_round):.1f} | {statistics.median(ratios):.2f}x | "
                     f"{min(ratios):.2f}x - {max(ratios):.2f}x |")
    m = machine()
    text = "\n".join([
        "# Our fastest llama.cpp-backend row against llama.cpp's own decoding, round by round", "",
        f"`python scripts/llamacpp_duel.py --method {args.method} --gamma {args.gamma} --prompts {args.prompts} "
        f"--rounds {args.rounds}`; {now()}; {m['cpu_model']} ({m['cores']} cores); {THREADS} threads; the zoo's f32 "
        f"target GGUF, our draft at the default q8_0; {args.prompts} HumanEval prompts x {NEW_TOKENS} tokens (EOS "
        f"stops), greedy; every prompt through every row in each of {args.rounds} rounds, the order rotated per "
        f"prompt, one warm-up generation each. Our text equals llama.cpp's plain greedy text on every prompt of "
        "every round.", "",
        "| ours | peer | ours tok/s (median round) | peer tok/s (median round) | ours / peer (median round) | "
        "range over rounds |",
        "|---|---|---:|---:|---:|---|", *lines, "",
        "## Rounds", "",
        "| round | " + " | ".join(f"`{n}` tok/s" for n in names) + " |",
        "|---|" + "---:|" * len(names),
        *[f"| {r + 1} | " + " | ".join(f"{x[n]:.1f}" for n in names) + " |" for r, x in enumerate(per_round)], ""])
    out = ROOT / "benchmarks" / "llamacpp-duel.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
