"""The issue's head-to-head ratios over several rounds in one process, so each ratio comes with its spread (one
bench run on a shared machine moves llama.cpp's rows by about 10%).

The rows are the bench's own runners (`draftverify bench --backend hf,llamacpp`, bench/lineup.py), built once; each
round is the bench's measurement (bench/run.py: prompt-major, every prompt through every row, the order rotated
per prompt; the first round after one warm-up generation per row). A round's ratio is ours over the peer in that
round. In each pair ours must give the peer's greedy text on every prompt (both rows run the same target on the
same backend); a difference stops the script.

Usage: python scripts/bench_rounds.py [--pairs OURS/PEER,...] [--prompts 8] [--rounds 5]
(the rows are built with gammas conf and conf=0.9, so a pair names rows at those)
Writes benchmarks/bench-rounds.md (and prints it)."""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from draftverify import DraftVerifyError
from draftverify.bench.config import BenchConfig
from draftverify.bench.environment import machine, now
from draftverify.bench.lineup import build_runners
from draftverify.bench.models import load_models
from draftverify.bench.prompts import load_prompts
from draftverify.bench.run import measure, select_prompts, tokens_per_second
from draftverify.bench.runners import install_hooks
from ab_options import ab_parser, write_report

# the aims: ours on llama.cpp against llama.cpp plain (2x) and its prompt lookup at llama-cpp-python's
# defaults (1.5x), with the zoo draft and with its aligned twin at the threshold chosen on held-out prompts
# (benchmarks/lookup-agreement-ab-from-100.md: 0.9 once lookup's agreement counts as confidence); `model` with the
# confidence stop on HF against transformers' assisted generation at its defaults, the same zoo pair
PAIRS = ",".join(["llamacpp:model[conf]/llamacpp", "llamacpp:model[conf]/llamacpp_prompt_lookup[default]",
                  "llamacpp:model_aligned[conf=0.9]/llamacpp",
                  "llamacpp:model_aligned[conf=0.9]/llamacpp_prompt_lookup[default]",
                  "model[conf]/hf_assisted[hf-default]"])
FAMILIES = ("llamacpp", "llamacpp_prompt_lookup", "hf_assisted", "model", "model_aligned")


def main() -> None:
    ap = ab_parser(rounds=5)
    ap.add_argument("--pairs", default=PAIRS)
    args = ap.parse_args()
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")]
    if any(len(p) != 2 for p in pairs):
        ap.exit(2, "error: --pairs takes a comma list of OURS/PEER row names\n")
    torch.set_num_threads(2)
    config = BenchConfig(zoo="code", backends=("hf", "llamacpp"), runners=FAMILIES, gammas=("conf", "conf=0.9"),
                         temperatures=(0.0,), threads=2, num_prompts=args.prompts, max_new_tokens=128,
                         progress=False, plots=False).resolved()
    try:
        models = load_models(config)
        hooks = install_hooks(models)
        runners, _ = build_runners(config, models, hooks)
        chosen, _ = select_prompts(load_prompts(config.prompts, config.data_dir), models, config)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    wanted = {name for pair in pairs for name in pair}
    missing = wanted - {r.name for r in runners}
    if missing:
        ap.exit(2, f"error: no bench row named {', '.join(sorted(missing))} (rows: "
                   f"{', '.join(r.name for r in runners)})\n")
    rows = [r for r in runners if r.name in wanted]
    per_round = []
    for r in range(args.rounds):
        records = measure(rows, config if r == 0 else replace(config, warmup_tokens=0), chosen, models.tokenizer)
        texts = {(rec["runner"], rec["prompt_index"]): rec["new_ids"] for rec in records}
        for ours, peer in pairs:
            for i in range(len(chosen)):
                if texts[ours, i] != texts[peer, i]:
                    raise SystemExit(f"round {r + 1}, prompt {i}: {ours} and {peer} gave different greedy text")
        speed = tokens_per_second(records)
        per_round.append(speed)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in speed.items()), flush=True)
    hooks.remove()
    lines = []
    for ours, peer in pairs:
        ratios = [x[ours] / x[peer] for x in per_round]
        lines.append(f"| `{ours}` | `{peer}` | {statistics.median(x[ours] for x in per_round):.1f} | "
                     f"{statistics.median(x[peer] for x in per_round):.1f} | {statistics.median(ratios):.2f}x | "
                     f"{min(ratios):.2f}x - {max(ratios):.2f}x |")
    names = [row.name for row in rows]
    m = machine()
    text = "\n".join([
        "# Head to head over rounds", "",
        f"`python scripts/bench_rounds.py --prompts {args.prompts} --rounds {args.rounds}`"
        + ("" if args.pairs == PAIRS else f" `--pairs {args.pairs}`") + f"; {now()}; {m['cpu_model']} "
        f"({m['cores']} cores), 2 threads; the zoo pair, llama.cpp rows on the f32 target GGUF (our draft: q8_0); "
        f"{len(chosen)} HumanEval prompts x 128 tokens, greedy; {args.rounds} rounds of the bench's measurement "
        "in one process. In every pair ours gave the peer's greedy text on every prompt of every round.", "",
        "| ours | peer | ours tok/s (median round) | peer tok/s (median round) | ours / peer (median round) | "
        "range over rounds |",
        "|---|---|---:|---:|---:|---|", *lines, "",
        "## Rounds (tok/s)", "",
        "| round | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---:|" * len(names),
        *[f"| {r + 1} | " + " | ".join(f"{x[n]:.1f}" for n in names) + " |" for r, x in enumerate(per_round)], ""])
    write_report("bench-rounds.md", text)


if __name__ == "__main__":
    main()
