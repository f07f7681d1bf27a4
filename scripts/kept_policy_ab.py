"""A/B of gamma `conf` kept across calls (a Pipeline's KeptPolicies, draft_length.py) against a fresh policy per
call that shares only the pipeline's timings (what every call got before), on both backends, alternating prompt by
prompt in one process. The text is the same either way (the draft length never changes what greedy keeps); a
difference stops the script.

Usage: python scripts/kept_policy_ab.py [--backends llamacpp,hf] [--method model] [--prompts 8] [--rounds 3]
Writes benchmarks/kept-policy.md (and prints it)."""
from __future__ import annotations

import time

import torch

from draftverify import DraftVerifyError, load
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from draftverify.draft_length import make_draft_length
from ab_options import ab_parser, write_report

GAMMA = "conf"


def main() -> None:
    ap = ab_parser()
    ap.add_argument("--backends", default="llamacpp,hf")
    ap.add_argument("--method", default="model")
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    lines = []
    for backend in args.backends.split(","):
        extra = {"backend": backend, "threads": 2} if backend != "hf" else {}
        try:
            pipes = {mode: load(zoo="code", method=args.method, gamma=GAMMA, **extra) for mode in ("kept", "fresh")}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")

        def call(mode: str, text: str, tokens: int):
            pipe = pipes[mode]
            gamma = None if mode == "kept" else make_draft_length(GAMMA, pipe.step_costs, pipe.target.max_positions)
            return pipe.generate(text, max_new_tokens=tokens, gamma=gamma).output

        for mode in pipes:
            call(mode, prompts[0], 16)  # warm-up, as the bench does
        totals = {mode: [0, 0.0, 0] for mode in pipes}
        texts: dict[int, list[int]] = {}
        for r in range(args.rounds):
            for i, text in enumerate(prompts):
                for mode in (("kept", "fresh") if (r + i) % 2 == 0 else ("fresh", "kept")):
                    started = time.perf_counter()
                    out = call(mode, text, 128)
                    seconds = time.perf_counter() - started
                    ids = out.new_tokens[0].tolist()
                    if texts.setdefault(i, ids) != ids:
                        raise SystemExit(f"prompt {i}: the {mode} policy gave another text")
                    totals[mode][0] += len(ids)
                    totals[mode][1] += seconds
                    totals[mode][2] += out.stats.target_calls
        speed = {mode: n / s for mode, (n, s, _) in totals.items()}
        for mode, (n, s, calls) in totals.items():
            lines.append(f"| {backend} | `{args.method}[{GAMMA}]` | {mode} | {speed[mode]:.1f} | "
                         f"{speed[mode] / speed['fresh']:.2f}x | {n / calls:.2f} |")
        del pipes
    m = machine()
    text = "\n".join([
        "# gamma conf's policy kept across calls, or made fresh per call", "",
        f"`python scripts/kept_policy_ab.py --backends {args.backends} --method {args.method} --prompts {args.prompts} "
        f"--rounds {args.rounds}`; {now()}; {m['cpu_model']} ({m['cores']} cores), 2 threads; the code zoo (llama.cpp: "
        f"f32 target GGUF, q8_0 draft); {args.prompts} HumanEval prompts x 128 tokens, greedy, after one 16-token "
        f"warm-up; two pipelines, the modes alternating prompt by prompt over {args.rounds} rounds. **kept**: the "
        "pipeline's one conf policy (timings, acceptance and confidence rates kept across calls); **fresh**: a new "
        "policy each call sharing only the pipeline's timings. Same text in both modes on every prompt.", "",
        "| backend | row | policy | tok/s | vs fresh | tokens / call |", "|---|---|---|---:|---:|---:|", *lines, ""])
    write_report("kept-policy.md", text)


if __name__ == "__main__":
    main()
