"""gamma `conf`'s longest draft (ConfidenceGamma.max_gamma), 32 against 64, side by side in one process.

The confidence stop ends a draft where the drafter is unsure, and the cost model picks the cap below max_gamma;
max_gamma only bounds the drafts that stay sure, the long copies of boilerplate. With prompt lookup's agreement
counting as confidence those run longer, and a cap of 32 cuts them into several verify forwards; whether a longer
cap pays is this script's question (the default stays 32: on held-out prompts 64 was faster for one row and slower
for the two others, benchmarks/conf-cap-ab-from-100.md). Rows: the llama.cpp
backend with the aligned draft at the bench's conf=0.9 and with the zoo draft at `conf`, and the HF backend with
the zoo draft at `conf`. Each setting is one policy kept across the calls (as a pipeline keeps its own); the text
must not change (the script stops if it does).

--first picks the first HumanEval prompt, so the choice can be checked on prompts the bench (the first 8) never
uses. The ratio column is the median over rounds of the setting's tok/s over max_gamma 32's.

Usage: python scripts/conf_cap_ab.py [--prompts 8] [--rounds 4] [--first 0]
Writes benchmarks/conf-cap-ab.md (--first 0) or conf-cap-ab-from-N.md (and prints it)."""
from __future__ import annotations

from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from draftverify.draft_length import DEFAULT_CONFIDENCE, ConfidenceGamma
from ab_options import ab_parser, alternating_rounds, humaneval_texts, report_name, round_cells, run_line, write_report

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
CAPS = (32, 64)
ROWS = (("llamacpp", "draft-aligned", 0.9), ("llamacpp", "draft", DEFAULT_CONFIDENCE), ("hf", "draft", DEFAULT_CONFIDENCE))


def main() -> None:
    ap = ab_parser(rounds=4, first=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = humaneval_texts(ap, args)
    lines = []
    for backend, draft, threshold in ROWS:
        try:
            pipes = {cap: load(zoo="code", draft=ROOT / "zoo" / "code" / draft, method="model", backend=backend,
                               threads=2) for cap in CAPS}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")
        policies = {cap: ConfidenceGamma(threshold, max_gamma=cap, costs=pipes[cap].step_costs) for cap in CAPS}
        for cap, pipe in pipes.items():
            pipe.generate(prompts[0], max_new_tokens=32, gamma=policies[cap])  # warm-up
        rounds = alternating_rounds(
            lambda cap, text: pipes[cap].generate(text, max_new_tokens=NEW_TOKENS, gamma=policies[cap]), list(CAPS),
            prompts, args.rounds, args.first, f"{backend} caps")
        gamma = f"conf={threshold:g}" if threshold != DEFAULT_CONFIDENCE else "conf"
        for cap in CAPS:
            lines.append(f"| {backend} | `{draft}` | {gamma} | {cap} | {round_cells(rounds, cap, CAPS[0])} |")
    last = args.first + len(prompts) - 1
    text = "\n".join([
        "# gamma conf's longest draft, 32 against 64", "",
        f"{run_line('conf_cap_ab.py', args)}, 2 threads; `model` on the zoo target "
        f"(llama.cpp: the f32 target GGUF, the draft at q8_0), HumanEval prompts {args.first}..{last} x "
        f"{NEW_TOKENS} tokens, greedy, {args.rounds} rounds in one process, the caps alternating prompt by prompt; "
        "each cap gave the same text on every prompt. **max_gamma**: ConfidenceGamma's longest draft (the cost "
        "model picks the cap at or below it). **vs 32**: median over rounds of tok/s over max_gamma 32's, with the "
        "range over rounds.", "",
        "| backend | draft | gamma | max_gamma | tok/s (median round) | vs 32 | tokens / call |",
        "|---|---|---|---:|---:|---:|---:|", *lines, ""])
    write_report(report_name("conf-cap-ab", args), text)


if __name__ == "__main__":
    main()
