"""Prompt lookup's agreement as draft confidence, on and off, side by side in one process.

With staged drafting the model drafter already knows, for each drafted token, whether prompt lookup proposes the
same token there (drafters/model.py ModelDrafter.lookup_confirms). On: such a token counts as confident whatever the
draft's max q, so the confidence stop ends a draft only where the two drafters disagree or lookup has nothing. The
proposals and the text are the same either way (only the draft length changes; the script stops if a text
differs), so only speed and tokens per call move. Rows: the llama.cpp backend with the aligned draft at the bench's
conf=0.8 and at higher thresholds (which the agreement makes pay), and both backends with the zoo draft at `conf`.

--first picks the first HumanEval prompt, so a threshold can be chosen on prompts the bench (the first 8) never
uses. Each round runs every setting of a row on every prompt, the order rotated prompt by prompt; the ratio column
is the median over rounds of on / the row's reference setting (the bench's: off at the row's first gamma).

Usage: python scripts/lookup_agreement_ab.py [--prompts 8] [--rounds 5] [--first 0]
Writes benchmarks/lookup-agreement-ab.md (--first 0) or lookup-agreement-ab-from-N.md (and prints it)."""
from __future__ import annotations

from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from ab_options import ab_parser, alternating_rounds, humaneval_texts, report_name, round_cells, run_line, write_report

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
ROWS = (("llamacpp", "draft-aligned", ("conf=0.8", "conf=0.9", "conf=0.95")),
        ("llamacpp", "draft", ("conf",)),
        ("hf", "draft", ("conf",)))


def main() -> None:
    ap = ab_parser(rounds=5, first=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = humaneval_texts(ap, args)
    lines = []
    for backend, draft, gammas in ROWS:
        settings = [(gamma, confirms) for gamma in gammas for confirms in (False, True)]
        try:
            pipes = {s: load(zoo="code", draft=ROOT / "zoo" / "code" / draft, method="model", backend=backend,
                             gamma=s[0], threads=2) for s in settings}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")
        for (_, confirms), pipe in pipes.items():
            pipe.drafter.lookup_confirms = confirms
            pipe.generate(prompts[0], max_new_tokens=32)  # warm-up
        rounds = alternating_rounds(lambda s, text: pipes[s].generate(text, max_new_tokens=NEW_TOKENS), settings,
                                    prompts, args.rounds, args.first, f"{backend} settings")
        for s in settings:
            lines.append(f"| {backend} | `{draft}` | {s[0]} | {'on' if s[1] else 'off'} | "
                         f"{round_cells(rounds, s, settings[0])} |")
    last = args.first + len(prompts) - 1
    text = "\n".join([
        "# Prompt lookup's agreement as draft confidence", "",
        f"{run_line('lookup_agreement_ab.py', args)}, 2 threads; `model` on the zoo target "
        f"(llama.cpp: the f32 target GGUF, the draft at q8_0), HumanEval prompts {args.first}..{last} x "
        f"{NEW_TOKENS} tokens, greedy, {args.rounds} rounds in one process, the settings alternating prompt by "
        "prompt; every setting gave the same text on every prompt. **agreement on**: a drafted token that prompt "
        "lookup proposes too counts as confident (ModelDrafter.lookup_confirms); **off**: the draft's max q alone. "
        "**vs reference**: median over rounds of tok/s over the row's first setting (off at its first gamma), "
        "with the range over rounds.", "",
        "| backend | draft | gamma | agreement | tok/s (median round) | vs reference | tokens / call |",
        "|---|---|---|---|---:|---:|---:|", *lines, ""])
    write_report(report_name("lookup-agreement-ab", args), text)


if __name__ == "__main__":
    main()
