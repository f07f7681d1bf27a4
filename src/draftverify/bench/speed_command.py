"""`draftverify bench speed`, the main speed bench: its flags (cli.py does the work). Nothing heavy is imported
here, so --help stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ..cli_flags import declared_flags
from ..cli_help import draft_methods, flag
from ..devices import DEVICE_HELP, DTYPE_HELP
from ..quiet import quiet_process
from . import folders
from .runner_families import ALIGNED_SUFFIX, BASELINES, GGUF_SUFFIX, PEER_FAMILIES, drafting_methods

RUNNERS_HELP = (
    f"Comma list of runner families to run (the baselines {' and '.join(BASELINES)} always run): the "
    f"peers {', '.join(PEER_FAMILIES)}; our methods {', '.join(drafting_methods())}; and "
    f"<method>{ALIGNED_SUFFIX} for a method with the aligned draft (--aligned-draft); <method>{GGUF_SUFFIX} "
    f"({', '.join(n for n, m in drafting_methods().items() if m.gguf_option)}) with its piece converted to GGUF "
    "and run in llama.cpp (--backend llamacpp). llama.cpp's own C++ "
    "speculative decoding (llama-server, built by scripts/build_llama_cpp_tools.sh) runs only when named: "
    "llamacpp_native[plain], llamacpp_native[TYPE,...,n_max=N,p_min=P,draft=draft|aligned] with TYPE its "
    "--spec-type (draft-simple, ngram-mod, ngram-map-k, ngram-map-k4v, ngram-simple; several chain), one row each, "
    "or llamacpp_native for a default set."
)


# the speed bench sweeps BiLD's thresholds and the early-exit layer counts itself
@declared_flags(shared=False, exclude=("early_exit_layers",))
def speed(
    prompts: str = flag(
        "humaneval",
        "--prompts",
        help="humaneval, spec_bench, spec_bench:<category> (e.g. spec_bench:translation, spec_bench:mt_bench),"
        " or your own prompts: a .jsonl file whose records have a 'prompt' field,"
        " or a text file with one prompt per line.",
    ),
    data_dir: Optional[Path] = flag(
        None,
        "--data-dir",
        help="Folder holding humaneval/ and spec_bench/ (default: $DRAFTVERIFY_DATA, else the copies shipped with "
        "draftverify).",
    ),
    num_prompts: Optional[int] = flag(
        None, "--num-prompts", help="Prompts to run: the first N that fit the context (default 20; --quick 2)."
    ),
    max_new_tokens: Optional[int] = flag(
        None, "--max-new-tokens", "-n", help="New tokens per generation (default 128; --quick 8)."
    ),
    temperature: Optional[str] = flag(
        None,
        "--temperature",
        help="Comma list; 0 = greedy (lossless runners must match the baseline), > 0 = sampling (default 0,1.0; "
        "--quick 0).",
    ),
    zoo: Optional[str] = flag(
        None,
        "--zoo",
        help="Shipped model set (target, draft, draft-aligned, ngram table); default 'code' unless --target is given.",
    ),
    target: Optional[str] = flag(None, "--target", "-t", help="Target model directory (overrides the zoo's)."),
    draft: Optional[str] = flag(
        None, "--draft", "-d", help=f"Draft model (the hf_assisted rows and methods {draft_methods()})."
    ),
    aligned_draft: Optional[str] = flag(
        None,
        "--aligned-draft",
        help="Aligned draft model (the <method>_aligned rows of the methods that take a draft).",
    ),
    gamma: Optional[str] = flag(
        None,
        "--gamma",
        help="Comma list of draft lengths: integers, 'auto', 'heuristic', 'conf[=T]' (auto's length as a cap, drafts "
        "ending at the draft model's first token with max q <= T, default 0.4) (default 2,3,4,5,6,8,auto; --quick "
        "3,auto).",
    ),
    early_exit_layers: Optional[str] = flag(
        None,
        "--early-exit-layers",
        help="Comma list of early-exit layer counts (default: ~1/4 and ~1/2 of the target's layers).",
    ),
    bild_fb: Optional[str] = flag(
        None, "--bild-fb", help="BiLD fallback thresholds alpha_FB (default 0.2,0.4,0.6,0.8)."
    ),
    bild_rb: Optional[str] = flag(None, "--bild-rb", help="BiLD rollback thresholds alpha_RB (default 1,2,3,5)."),
    bild_gamma: int = flag(
        10, "--bild-gamma", help="Longest BiLD draft before the target is called anyway (BiLD: 10)."
    ),
    runners: Optional[str] = flag(None, "--runners", help=RUNNERS_HELP),
    seed: int = flag(0, "--seed", help="Sampling seed of prompt i is seed + i, the same for every runner."),
    warmup_tokens: Optional[int] = flag(
        None,
        "--warmup-tokens",
        help="Tokens of the one warm-up generation per runner (0: none; default 16, --quick 0).",
    ),
    threads: Optional[int] = flag(None, "--threads", help="CPU threads for torch (default: torch's choice)."),
    device: str = flag("cpu", "--device", help=DEVICE_HELP),
    dtype: str = flag("auto", "--dtype", help=DTYPE_HELP),
    compile_: bool = flag(
        False,
        "--compile",
        help="Our runners (ours_autoregressive and every method row) run the target and draft models compiled: "
        "preallocated KV cache + torch.compile per verify-width bucket; the warm-up compiles every width a runner uses "
        "(seconds recorded per runner), peers stay eager. Name the run apart, e.g. --name bench-humaneval-compiled.",
    ),
    out: Optional[Path] = flag(
        None,
        "--out",
        help=f"Output folder for <name>.json, <name>.md and <name>-*.png (default {folders.SPEED}, with --cost-curve "
        f"{folders.COST}).",
    ),
    name: Optional[str] = flag(None, "--name", help="File stem (default bench-<prompts>[-quick])."),
    quick: bool = flag(
        False,
        "--quick",
        help="Smoke test (about a minute on 2 CPU cores): every runner type once, greedy, 2 prompts, 8 tokens, gamma 3 "
        "(and auto once), no warm-up, BiTA with one mask token; each flag still overrides.",
    ),
    plots: bool = flag(True, "--plots/--no-plots", help="Write the PNG plots."),
    progress: bool = flag(
        True,
        "--progress/--no-progress",
        help="Show progress on stderr: a bar on a terminal, else a line per runner and prompt.",
    ),
    cost_curve: bool = flag(
        False,
        "--cost-curve",
        help="Instead: time one target forward scoring n tokens after a 120-token context, eager vs torch.compile, "
        "float32 vs bfloat16, with greedy equality rates (uses --zoo/--target, --threads, --num-prompts and "
        "--max-new-tokens for the equality check, --out, --name, --quick).",
    ),
    cost_sizes: Optional[str] = flag(
        None,
        "--cost-sizes",
        help="Comma list of n for --cost-curve (default 1,2,3,4,5,6,8,10,12,16,24,32,48,64; --quick 1,2).",
    ),
    cost_modes: Optional[str] = flag(
        None,
        "--cost-modes",
        help="Comma list for --cost-curve: eager-float32 (the engine: few-row linears as W @ x.T), eager-float32-gemm "
        "(stock F.linear), eager-bfloat16, compiled-float32, compiled-bfloat16 (default all).",
    ),
    cost_repeats: Optional[int] = flag(
        None, "--cost-repeats", help="Timed calls per n for --cost-curve (default 20; --quick 2)."
    ),
    backend: str = flag(
        "hf",
        "--backend",
        help="Comma list of what runs our rows: hf, llamacpp (rows llamacpp:<row>: our loop on llama.cpp's kernels, "
        "the target converted to GGUF at --dtype, the draft at --draft-gguf, greedy only, '= baseline' against "
        "llama.cpp's own greedy row `llamacpp`), e.g. hf,llamacpp.",
    ),
    draft_gguf: Optional[str] = flag(
        None,
        "--draft-gguf",
        help="The draft model's GGUF type in the llama.cpp rows (llamacpp:* and llamacpp_draft alike): q8_0 (default), "
        "f32, f16 or bf16.",
    ),
    target_gguf: Optional[str] = flag(
        None,
        "--target-gguf",
        help="The target's GGUF type in every llama.cpp row (llamacpp:*, llamacpp*, llamacpp_native[...]): q8_0, "
        "f32, f16 or bf16 (default: --dtype's, f32 for float32). Name such a run apart, e.g. --name ...-q8_0.",
    ),
    flash_attn: Optional[bool] = flag(
        None,
        "--flash-attn/--no-flash-attn",
        help="llama.cpp's flash attention in every llama.cpp row (ours, llama-cpp-python's, llama-server's); default "
        "on, as llama.cpp runs it.",
    ),
    options: Optional[dict[str, Any]] = None,  # the declared drafter options' flags (cli_flags.py)
) -> None:
    """Benchmark our loop against Hugging Face generate / assisted generation / prompt lookup (same process)."""
    from .cli import main

    quiet_process()
    code = main(
        method_options=options or {},
        backend=backend,
        cost_curve=cost_curve,
        cost_sizes=cost_sizes,
        cost_modes=cost_modes,
        cost_repeats=cost_repeats,
        prompts=prompts,
        data_dir=data_dir,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        zoo=zoo,
        target=target,
        draft=draft,
        aligned_draft=aligned_draft,
        gamma=gamma,
        early_exit_layers=early_exit_layers,
        bild_fb=bild_fb,
        bild_rb=bild_rb,
        bild_gamma=bild_gamma,
        runners=runners,
        seed=seed,
        warmup_tokens=warmup_tokens,
        threads=threads,
        dtype=dtype,
        device=device,
        draft_gguf=draft_gguf,
        target_gguf=target_gguf,
        flash_attn=flash_attn,
        compile=compile_,
        out=out,
        name=name,
        quick=quick,
        plots=plots,
        progress=progress,
    )
    if code:
        raise typer.Exit(code)
