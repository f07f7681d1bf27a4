"""llama.cpp's peers with flash attention off (llama-cpp-python's Llama() default) and on (llama.cpp's own default,
flash_attn_type auto, which our backend runs: backends/llamacpp.py FLASH_ATTENTION), beside our best row, in one
process.

Why it matters: until the bench gave its peers FLASH_ATTENTION, they ran with it off while our backend ran with
it on, so every ratio over them measured the attention kernels as well as the method, and "equal to llama.cpp
greedy" compared outputs of two different computations. This script measures how much the kernel alone moves
the peers.

Rows are the bench's own runners (bench/llamacpp.py, bench/lineup.py) over the bench's token ids; each round is
the bench's measurement (bench/run.py: prompt-major, the order rotated per prompt). Ratios are per round, medians
over rounds. Usage: python scripts/llamacpp_flash_attn_ab.py [--prompts 8] [--rounds 3]
Writes benchmarks/llamacpp-flash-attn.md (and prints it)."""
from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from draftverify import DraftVerifyError
from draftverify.bench import llamacpp as peers
from draftverify.bench.config import BenchConfig
from draftverify.bench.environment import machine, now
from draftverify.bench.lineup import build_runners
from draftverify.bench.models import load_models
from draftverify.bench.prompts import load_prompts
from draftverify.bench.run import measure, select_prompts, tokens_per_second
from draftverify.bench.runners import install_hooks
from ab_options import ab_parser, write_report

OURS = "llamacpp:model_aligned[conf=0.9]"
PEERS = ("llamacpp", "llamacpp_prompt_lookup[default]")


def main() -> None:
    ap = ab_parser()
    args = ap.parse_args()
    torch.set_num_threads(2)
    config = BenchConfig(zoo="code", backends=("llamacpp",), runners=("llamacpp", "llamacpp_prompt_lookup",
                                                                      "model_aligned"),
                         gammas=("conf=0.9",), temperatures=(0.0,), threads=2, num_prompts=args.prompts,
                         max_new_tokens=128, progress=False, plots=False).resolved()
    try:
        models = load_models(config)
        hooks = install_hooks(models)
        runners, _ = build_runners(config, models, hooks)  # the peers with FLASH_ATTENTION (on)
        peers.FLASH_ATTENTION = False  # the same peers as llama-cpp-python's Llama() makes them by default
        off, _ = peers.llamacpp_runners(config, models)
        chosen, _ = select_prompts(load_prompts(config.prompts, config.data_dir), models, config)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    for runner in off:
        runner.name += " (flash attention off)"
    rows = [r for r in runners if r.name in (OURS, *PEERS)] + [r for r in off if r.name.split(" ")[0] in PEERS]
    per_round, same = [], {r.name: 0 for r in rows}
    for r in range(args.rounds):
        records = measure(rows, config if r == 0 else replace(config, warmup_tokens=0), chosen, models.tokenizer)
        texts = {(rec["runner"], rec["prompt_index"]): rec["new_ids"] for rec in records}
        for row in rows:  # equal to the on-kernel plain greedy text, prompt by prompt
            same[row.name] += sum(texts[row.name, i] == texts["llamacpp", i] for i in range(len(chosen)))
        speed = tokens_per_second(records)
        per_round.append(speed)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in speed.items()), flush=True)
    hooks.remove()
    med = lambda f: statistics.median(f(x) for x in per_round)  # noqa: E731
    lines = []
    for peer in PEERS:
        off_name = f"{peer} (flash attention off)"
        lines.append(f"| `{peer}` | {med(lambda x: x[off_name]):.1f} | {med(lambda x: x[peer]):.1f} | "
                     f"{med(lambda x: x[peer] / x[off_name]):.2f}x |")
    total = args.rounds * len(chosen)
    m = machine()
    text = "\n".join([
        "# llama.cpp's peers: flash attention off and on", "",
        f"`python scripts/llamacpp_flash_attn_ab.py --prompts {args.prompts} --rounds {args.rounds}`; {now()}; "
        f"{m['cpu_model']} ({m['cores']} cores), 2 threads; the zoo target (f32 GGUF), {len(chosen)} HumanEval "
        f"prompts x 128 tokens, greedy; {args.rounds} rounds of the bench's measurement in one process (medians "
        f"over rounds). Off: llama-cpp-python's `Llama()` default. On: llama.cpp's own default (flash_attn_type "
        f"auto turns it on for the CPU), which our backend runs, and which the bench's peers now run too. Ours: "
        f"`{OURS}` (median {med(lambda x: x[OURS]):.1f} tok/s). The ratios of ours over the peers belong to the "
        "bench run, where every tool runs in one process with the HF rows: llama.cpp's plain row runs at different "
        "speeds in processes of different make-up and at different times on this shared machine (here and in the "
        "bench), much more than our rows do.", "",
        "| peer | off tok/s | on tok/s | on / off |",
        "|---|---:|---:|---:|", *lines, "",
        "Greedy text equal to the plain peer's with flash attention on, prompt by prompt over all rounds: "
        + ", ".join(f"`{n}` {same[n]}/{total}" for n in same) + ".", ""])
    write_report("llamacpp-flash-attn.md", text)


if __name__ == "__main__":
    main()
