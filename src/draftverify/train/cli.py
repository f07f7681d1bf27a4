"""``draftverify train ...`` commands.

The main CLI mounts this app with ``app.add_typer(train_app, name="train")``.
Standalone: ``python -m draftverify.train.cli tokenizer|lm|bench ...``.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from .corpus import PACKAGES_ROOT

train_app = typer.Typer(
    name="train",
    help="Build the code corpus/tokenizer and train the project's small target/draft models.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _command_line() -> str:
    argv = list(sys.argv)
    prog = Path(argv[0]).name if argv else "draftverify"
    if prog in ("cli.py", "__main__.py", "-m"):
        prog = "python -m draftverify.train.cli"
    return " ".join([prog] + [shlex.quote(a) for a in argv[1:]])


@train_app.command("tokenizer")
def tokenizer_cmd(
    out: Path = typer.Option(Path("zoo/code/tokenizer"), "--out", help="Tokenizer output directory."),
    manifest: Optional[Path] = typer.Option(
        None, "--manifest", help="Manifest JSON to write (default: <out>/../manifest.json)."),
    vocab_size: int = typer.Option(8192, "--vocab-size", help="BPE vocabulary size (incl. <|endoftext|>)."),
    root: Optional[Path] = typer.Option(
        None, "--root", help="Directory of .py files (default: this interpreter's stdlib)."),
    val_fraction: float = typer.Option(0.02, "--val-fraction", help="Fraction of files held out for validation."),
) -> None:
    """Build the corpus manifest (stdlib .py files, split by file) and train the BPE tokenizer."""
    from .corpus import CorpusError
    from .tokenizer import TokenizerError, build_tokenizer_from_corpus

    manifest = manifest or out.parent / "manifest.json"
    if root is not None and not root.is_dir():
        _fail(f"--root {root} is not a directory")
    if not 0 <= val_fraction < 1:
        _fail("--val-fraction must be in [0, 1)")
    try:
        info = build_tokenizer_from_corpus(out, manifest, vocab_size=vocab_size, root=root,
                                           val_fraction=val_fraction)
    except (CorpusError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(f"manifest: {manifest} ({info['counts']['train']} train / {info['counts']['val']} val files, "
               f"sha256 {info['manifest_files_sha256'][:16]})")
    typer.echo(f"tokenizer: {out} (vocab {info['vocab_size']}, "
               f"{info['val_chars_per_token']:.2f} chars/token on val)")


CODE_PACKAGES = (
    "django==5.2.19", "flask==3.1.3", "requests==2.34.2", "click==8.5.1", "attrs==26.1.0", "pytest==9.2.0",
    "rich==15.0.0", "networkx==3.6.1", "sympy==1.14.0", "numpy==2.4.6", "scikit-learn==1.9.1", "pandas==3.1.1",
    "scipy==1.17.1", "matplotlib==3.11.2", "sqlalchemy==2.1.9", "jinja2==3.1.6", "werkzeug==3.1.9", "pip==26.3",
    "setuptools==84.2.1", "black==26.10.1", "tornado==6.6.1", "pygments==2.21.0", "sphinx==9.0.4",
    "astropy==8.0.2", "statsmodels==0.15.0", "pyyaml==6.0.3", "urllib3==2.8.0", "aiohttp==3.14.5",
    "fastapi==0.165.0", "pydantic==2.14.3", "starlette==1.10.0", "httpx==0.28.1", "transformers==5.23.0",
    "boto3==1.44.5", "botocore==1.44.5", "twisted==26.10.0", "typer==0.29.2", "more-itertools==11.2.1",
    "toolz==1.2.0", "dask==2026.8.0", "xarray==2026.9.0", "seaborn==0.13.2", "pillow==13.0.0",
)


@train_app.command("corpus")
def corpus_cmd(
    out: Path = typer.Option(Path("zoo/code/manifest.json"), "--out", help="Manifest JSON to write."),
    src_root: Path = typer.Option(PACKAGES_ROOT, "--src-root",
                                  help="Where the stdlib copy and the unpacked packages go (the corpus root)."),
    wheel_dir: Path = typer.Option(Path("runs/wheels"), "--wheel-dir", help="Where pip downloads the wheels."),
    package: Optional[list[str]] = typer.Option(
        None, "--package", help="Requirement to add (repeatable); default: the project's pinned list."),
    download: bool = typer.Option(True, "--download/--no-download", help="Fetch wheels (else use --wheel-dir as is)."),
    val_fraction: float = typer.Option(0.02, "--val-fraction", help="Fraction of files held out for validation."),
) -> None:
    """Build the code corpus: the stdlib plus permissively licensed PyPI packages, licence per file, deduplicated."""
    from .corpus import CorpusError, build_manifest
    from .packages import fetch_wheels, unpack_sources

    if not 0 <= val_fraction < 1:
        _fail("--val-fraction must be in [0, 1)")
    try:
        if download:
            fetch_wheels(list(package or CODE_PACKAGES), wheel_dir)
        if not wheel_dir.is_dir():
            _fail(f"--wheel-dir {wheel_dir} does not exist; run without --no-download")
        used = unpack_sources(wheel_dir, src_root)
        sources = [{"dir": f"{u.name}-{u.version}" if u.wheel else f"cpython-{u.version}", "name": u.name,
                    "version": u.version, "license": u.license, "wheel": u.wheel} for u in used]
        m = build_manifest(out, root=src_root, val_fraction=val_fraction, sources=sources)
    except CorpusError as e:
        _fail(str(e))
    typer.echo(f"manifest: {out} ({m['counts']['train']} train / {m['counts']['val']} val files, "
               f"{(m['bytes']['train'] + m['bytes']['val']) / 1e6:.1f} MB, {len(sources)} sources, "
               f"{len(m['skipped'])} skipped)")


@train_app.command("lm")
def lm_cmd(
    tokenizer: Path = typer.Option(Path("zoo/code/tokenizer"), "--tokenizer", help="Tokenizer directory."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Corpus manifest JSON."),
    preset: str = typer.Option("target", "--preset", help="Architecture preset: target | draft (| tiny)."),
    out: Path = typer.Option(..., "--out", help="Run directory (checkpoint/, log.jsonl)."),
    export: Optional[Path] = typer.Option(
        None, "--export", help="Where to export the fp16 HF model (default: <out>/export)."),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Token cache directory (default: <out>/../token-cache)."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Wall-clock training budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum optimizer steps."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per step."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per training window."),
    lr: float = typer.Option(8e-4, "--lr", help="Peak learning rate."),
    warmup_steps: int = typer.Option(100, "--warmup-steps"),
    min_lr_ratio: float = typer.Option(0.1, "--min-lr-ratio", help="Final LR as a fraction of --lr."),
    weight_decay: float = typer.Option(0.1, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip"),
    seed: int = typer.Option(1234, "--seed"),
    init_from: Optional[Path] = typer.Option(
        None, "--init-from", help="Continue from an exported HF model dir (fresh optimizer)."),
    bf16: Optional[bool] = typer.Option(
        None, "--bf16/--no-bf16", help="bf16 autocast on CPU (default: the faster one measured on the dev box)."),
    eval_minutes: float = typer.Option(10.0, "--eval-minutes", help="Held-out eval interval (minutes)."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Held-out eval interval in steps (overrides --eval-minutes)."),
    val_windows: int = typer.Option(64, "--val-windows", help="Number of fixed validation windows."),
    checkpoint_minutes: float = typer.Option(10.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(10, "--log-every", help="Log a line / JSONL record every N steps."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: if a tty)."),
    early_exit_layer: Optional[int] = typer.Option(
        None, "--early-exit-layer", help="End the run with BiLD 4.4's averaged loss of this layer and the last."),
    early_exit_share: float = typer.Option(0.2, "--early-exit-share", help="Share of the run in that phase."),
    max_degradation: float = typer.Option(
        0.03, "--max-degradation", help="Drop the phase's weights if the full model's held-out loss rose more (nats)."),
) -> None:
    """Train (or resume) a LlamaForCausalLM from scratch on the code corpus and export it in fp16."""
    from . import lm

    if preset not in lm.PRESETS:
        _fail(f"unknown preset {preset!r}; choose one of: {', '.join(lm.PRESETS)}")
    opts = lm.TrainOptions(
        tokenizer=str(tokenizer), manifest=str(manifest), out_dir=str(out), preset=preset,
        export_dir=str(export) if export else None, cache_dir=str(cache_dir) if cache_dir else None,
        init_from=str(init_from) if init_from else None, seq_len=seq_len, batch_size=batch_size, lr=lr,
        min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip,
        max_steps=max_steps, max_minutes=max_minutes, threads=threads, bf16=bf16, seed=seed,
        eval_minutes=eval_minutes, eval_every_steps=eval_every, val_windows=val_windows,
        checkpoint_minutes=checkpoint_minutes, log_every=log_every, progress=progress,
        early_exit_layer=early_exit_layer, early_exit_share=early_exit_share, max_degradation=max_degradation,
        command=_command_line(),
    )
    try:
        summary = lm.train(opts, log=lambda m: typer.echo(m))
    except lm.TrainError as e:
        _fail(str(e))
    except MemoryError:
        _fail("out of memory; lower --batch-size or --seq-len")
    if summary.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({k: summary[k] for k in ("params", "step", "tokens_seen", "val_loss", "tokens_per_s")
                           if k in summary}))


@train_app.command("early-exit")
def early_exit_cmd(
    target: Path = typer.Option(Path("zoo/code/target"), "--target", help="Exported target model directory."),
    layer: int = typer.Option(..., "--layer", help="Early-exit layer L: the first L layers form the small model."),
    out: Path = typer.Option(..., "--out", help="Where to export the fine-tuned target."),
    work_dir: Path = typer.Option(Path("runs/early-exit"), "--work-dir", help="Checkpoint and logs (resumable)."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Corpus manifest JSON."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the target's)."),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Token cache directory (default: <work-dir>/../token-cache)."),
    max_degradation: float = typer.Option(
        0.03, "--max-degradation", help="Largest rise of the full model's held-out loss (nats) that may be exported."),
    force: bool = typer.Option(False, "--force", help="Export even when the full model degraded more."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Wall-clock training budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum optimizer steps."),
    lr: float = typer.Option(1e-4, "--lr", help="Peak learning rate."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per step."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per training window."),
    warmup_steps: int = typer.Option(20, "--warmup-steps"),
    min_lr_ratio: float = typer.Option(0.1, "--min-lr-ratio", help="Final LR as a fraction of --lr."),
    weight_decay: float = typer.Option(0.1, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip"),
    val_windows: int = typer.Option(64, "--val-windows", help="Number of fixed validation windows."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast on CPU."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Held-out eval interval in steps."),
    checkpoint_minutes: float = typer.Option(10.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(10, "--log-every", help="Log a line / JSONL record every N steps."),
    seed: int = typer.Option(1234, "--seed"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: if a tty)."),
) -> None:
    """BiLD early exit (section 4.4): fine-tune the target with the averaged loss of layer L and the last layer."""
    from .early_exit import EarlyExitOptions, train_early_exit
    from .trainer import TrainError

    opts = EarlyExitOptions(
        target=str(target), layer=layer, out_dir=str(out), work_dir=str(work_dir), manifest=str(manifest),
        tokenizer=str(tokenizer) if tokenizer else None, cache_dir=str(cache_dir) if cache_dir else None,
        seq_len=seq_len, val_windows=val_windows, max_degradation=max_degradation, force=force,
        max_minutes=max_minutes, max_steps=max_steps, lr=lr, batch_size=batch_size, warmup_steps=warmup_steps,
        min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, grad_clip=grad_clip, threads=threads, bf16=bf16,
        eval_every_steps=eval_every, checkpoint_minutes=checkpoint_minutes, log_every=log_every, seed=seed,
        progress=progress, command=_command_line(),
    )
    try:
        info = train_early_exit(opts, log=lambda m: typer.echo(m))
    except TrainError as e:
        _fail(str(e))
    if info.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({"layer": info["layer"], "full_before": info["before"]["full"],
                           "full_after": info["after"]["full"], "early_before": info["before"]["early"],
                           "early_after": info["after"]["early"], "degradation": info["degradation"],
                           "steps": info["step"], "out": info["out_dir"]}))


@train_app.command("bench")
def bench_cmd(
    preset: str = typer.Option("target", "--preset"),
    batch_size: int = typer.Option(4, "--batch-size"),
    seq_len: int = typer.Option(512, "--seq-len"),
    threads: int = typer.Option(1, "--threads"),
    steps: int = typer.Option(4, "--steps"),
) -> None:
    """Measure seconds/step of fp32 vs bf16 autocast training on this machine."""
    from .presets import PRESETS, bench_step_time

    if preset not in PRESETS:
        _fail(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    typer.echo(json.dumps(bench_step_time(preset, batch_size, seq_len, threads, steps), indent=1))


@train_app.command("ngram")
def ngram_cmd(
    out: Path = typer.Option(Path("zoo/code/ngram.safetensors"), "--out", help="Output table (safetensors)."),
    tokenizer: Path = typer.Option(Path("zoo/code/tokenizer"), "--tokenizer", help="Tokenizer directory."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Corpus manifest JSON."),
    from_generations: Optional[Path] = typer.Option(
        None, "--from-generations",
        help="Build from a JSONL of target generations (written by `train align`) instead of the corpus; "
             "only continuation tokens are counted as next tokens."),
    eval_generations: Optional[Path] = typer.Option(
        None, "--eval-generations", help="Also report top-1 accuracy on the continuations of this generations JSONL "
                                         "(e.g. runs/align/eval_before.jsonl: held-out target outputs)."),
    order: int = typer.Option(3, "--order", help="n: contexts of up to n-1 tokens."),
    min_count: int = typer.Option(2, "--min-count", help="Drop contexts seen fewer times (the unigram is kept)."),
    top_k: int = typer.Option(8, "--top-k", help="Keep at most this many next tokens per context."),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="Reuse/write `train lm`'s token cache here (e.g. runs/token-cache); "
                                  "default: tokenize in memory."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Use only the first N training tokens."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", help="Table vocabulary (default: the tokenizer's, or the generations file's)."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="Held-out top-1 accuracy on the val split."),
) -> None:
    """Build the n-gram drafter's table from the corpus training split (or target generations)."""
    from .ngram import NgramOptions, build
    from .trainer import TrainError

    opts = NgramOptions(
        out=str(out), tokenizer=str(tokenizer), manifest=str(manifest),
        from_generations=str(from_generations) if from_generations else None,
        eval_generations=str(eval_generations) if eval_generations else None, order=order, min_count=min_count,
        top_k=top_k, cache_dir=str(cache_dir) if cache_dir else None, max_tokens=max_tokens, vocab_size=vocab_size,
        evaluate=evaluate, command=_command_line(),
    )
    try:
        summary = build(opts, log=lambda m: typer.echo(m))
    except TrainError as e:
        _fail(str(e))
    typer.echo(json.dumps({k: summary[k] for k in ("contexts", "entries", "bytes", "tokens", "val_top1_accuracy",
                                                   "generations_top1_accuracy", "seconds_total") if k in summary}))


@train_app.command("align")
def align_cmd(
    target: Path = typer.Option(Path("zoo/code/target"), "--target", help="Exported target model directory."),
    draft: Path = typer.Option(Path("zoo/code/draft"), "--draft", help="Exported draft model directory to align."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Corpus manifest JSON."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the target's)."),
    out: Path = typer.Option(Path("zoo/code/draft-aligned"), "--out", help="Where to export the aligned draft."),
    work_dir: Path = typer.Option(
        Path("runs/align"), "--work-dir", help="Generation caches, fine-tune checkpoint and logs (resumable)."),
    generations: Optional[Path] = typer.Option(
        None, "--generations", help="Calibration generations JSONL (default: <work-dir>/generations.jsonl)."),
    num_prompts: int = typer.Option(1000, "--num-prompts", help="Calibration prompts from the train split."),
    eval_prompts: int = typer.Option(
        64, "--eval-prompts", help="Held-out prompts from the val split for alpha before/after (0 = skip)."),
    min_prompt_tokens: int = typer.Option(64, "--min-prompt-tokens"),
    max_prompt_tokens: int = typer.Option(256, "--max-prompt-tokens"),
    new_tokens: int = typer.Option(128, "--new-tokens", help="Greedy target tokens per prompt."),
    gamma: int = typer.Option(5, "--gamma", help="Draft length for generation and the alpha measurement."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Fine-tune wall-clock budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum fine-tune steps."),
    lr: float = typer.Option(5e-4, "--lr", help="Peak fine-tune learning rate."),
    batch_size: int = typer.Option(16, "--batch-size", help="Sequences (prompt + continuation) per step."),
    warmup_steps: int = typer.Option(20, "--warmup-steps"),
    min_lr_ratio: float = typer.Option(0.1, "--min-lr-ratio"),
    weight_decay: float = typer.Option(0.0, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast for the fine-tune."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Held-out continuation loss every N steps."),
    checkpoint_minutes: float = typer.Option(10.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(10, "--log-every"),
    seed: int = typer.Option(1234, "--seed"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: if a tty)."),
) -> None:
    """BiLD prediction alignment: fine-tune the draft on the target's greedy outputs; report alpha before/after."""
    from .align import AlignOptions, align
    from .trainer import TrainError

    opts = AlignOptions(
        target=str(target), draft=str(draft), manifest=str(manifest), tokenizer=str(tokenizer) if tokenizer else None,
        out_dir=str(out), work_dir=str(work_dir), generations=str(generations) if generations else None,
        num_prompts=num_prompts, eval_prompts=eval_prompts, min_prompt_tokens=min_prompt_tokens,
        max_prompt_tokens=max_prompt_tokens, new_tokens=new_tokens, gamma=gamma, seed=seed, max_steps=max_steps,
        max_minutes=max_minutes, lr=lr, batch_size=batch_size, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay, grad_clip=grad_clip, threads=threads, bf16=bf16, eval_every_steps=eval_every,
        checkpoint_minutes=checkpoint_minutes, log_every=log_every, progress=progress, command=_command_line(),
    )
    try:
        info = align(opts, log=lambda m: typer.echo(m))
    except TrainError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("interrupted; finished generations are cached: run the same command again to resume", err=True)
        raise typer.Exit(130)
    if info.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({
        "alpha_before": (info["before"] or {}).get("alpha"), "alpha_after": (info["after"] or {}).get("alpha"),
        "tokens_per_call_before": (info["before"] or {}).get("tokens_per_call"),
        "tokens_per_call_after": (info["after"] or {}).get("tokens_per_call"),
        "steps": info["finetune"]["step"], "out": info["out_dir"]}))


@train_app.command("heads")
def heads_cmd(
    target: Path = typer.Option(Path("zoo/code/target"), "--target", help="Exported target model directory (frozen)."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Corpus manifest JSON."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the target's)."),
    out: Path = typer.Option(Path("zoo/code/heads"), "--out", help="Where to save the heads (safetensors + JSON)."),
    work_dir: Path = typer.Option(Path("runs/heads"), "--work-dir", help="Generations, features, checkpoint (resumable)."),
    num_heads: int = typer.Option(4, "--num-heads", help="h, counting head 1 (the target itself); 2..9."),
    ffn_size: Optional[int] = typer.Option(None, "--ffn-size", help="Hidden layer of each head (default: hidden size)."),
    num_prompts: int = typer.Option(400, "--num-prompts", help="Training prompts from the train split."),
    eval_prompts: int = typer.Option(48, "--eval-prompts", help="Held-out prompts from the val split."),
    min_prompt_tokens: int = typer.Option(32, "--min-prompt-tokens"),
    max_prompt_tokens: int = typer.Option(128, "--max-prompt-tokens"),
    new_tokens: int = typer.Option(64, "--new-tokens", help="Greedy target tokens per prompt."),
    generate_batch: int = typer.Option(32, "--generate-batch", help="Prompts per batched greedy generation call."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Training wall-clock budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum training steps."),
    lr: float = typer.Option(2e-3, "--lr"),
    batch_size: int = typer.Option(512, "--batch-size", help="Positions per step."),
    warmup_steps: int = typer.Option(20, "--warmup-steps"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    checkpoint_minutes: float = typer.Option(2.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(50, "--log-every"),
    seed: int = typer.Option(1234, "--seed"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: if a tty)."),
) -> None:
    """Blockwise parallel decoding heads on a frozen target, trained on its own greedy continuations."""
    from . import lm
    from .heads import HeadsOptions, train_heads

    opts = HeadsOptions(
        target=str(target), manifest=str(manifest), tokenizer=str(tokenizer) if tokenizer else None,
        out_dir=str(out), work_dir=str(work_dir), num_heads=num_heads, ffn_size=ffn_size, num_prompts=num_prompts,
        eval_prompts=eval_prompts, min_prompt_tokens=min_prompt_tokens, max_prompt_tokens=max_prompt_tokens,
        new_tokens=new_tokens, generate_batch=generate_batch, seed=seed, batch_size=batch_size, max_steps=max_steps, max_minutes=max_minutes, lr=lr,
        warmup_steps=warmup_steps, threads=threads, checkpoint_minutes=checkpoint_minutes, log_every=log_every,
        progress=progress, command=_command_line(),
    )
    try:
        info = train_heads(opts, log=lambda m: typer.echo(m))
    except lm.TrainError as e:
        _fail(str(e))
    if info.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({"heldout_accuracy": info["heldout_accuracy"]["after"], "steps": info["steps"],
                           "out": str(out)}))


@train_app.command("bita")
def bita_cmd(
    target: Path = typer.Option(Path("zoo/code/target"), "--target", help="Exported target model directory (frozen)."),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest",
                                  help="Corpus manifest JSON (without the unpacked corpus: its stdlib files, read locally)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the target's)."),
    out: Path = typer.Option(Path("zoo/code/bita"), "--out", help="Where to save the adapter (safetensors + JSON + card)."),
    work_dir: Path = typer.Option(Path("runs/bita"), "--work-dir", help="Generations and checkpoints (resumable)."),
    prompt: str = typer.Option("deep", "--prompt", help="Prompt tokens: none (mask tokens only), shallow or deep."),
    num_masks: int = typer.Option(3, "--num-masks", help="M mask tokens (look-ahead positions)."),
    num_prompts: int = typer.Option(16, "--num-prompts", help="P prompt tokens (shallow / deep)."),
    num_train: int = typer.Option(512, "--num-train", help="Training prompts from the train split."),
    eval_prompts: int = typer.Option(32, "--eval-prompts", help="Held-out prompts from the val split."),
    min_prompt_tokens: int = typer.Option(32, "--min-prompt-tokens"),
    max_prompt_tokens: int = typer.Option(128, "--max-prompt-tokens"),
    new_tokens: int = typer.Option(96, "--new-tokens", help="Greedy target tokens per prompt."),
    gen_batch: int = typer.Option(32, "--gen-batch", help="Prompts generated together (batched greedy)."),
    cuts: int = typer.Option(16, "--cuts", help="Random cut points per sequence per step."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Training wall-clock budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum training steps."),
    lr: float = typer.Option(3e-2, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per step."),
    warmup_steps: int = typer.Option(20, "--warmup-steps"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    checkpoint_minutes: float = typer.Option(2.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(20, "--log-every"),
    seed: int = typer.Option(1234, "--seed"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: if a tty)."),
) -> None:
    """BiTA mask and prompt tokens on a frozen target, trained on its own greedy continuations (SAR loss)."""
    from . import lm
    from .bita import BitaOptions, train_bita

    opts = BitaOptions(
        target=str(target), manifest=str(manifest), tokenizer=str(tokenizer) if tokenizer else None, out_dir=str(out),
        work_dir=str(work_dir), prompt=prompt, num_masks=num_masks, num_prompts=num_prompts, num_train=num_train,
        eval_prompts=eval_prompts, min_prompt_tokens=min_prompt_tokens, max_prompt_tokens=max_prompt_tokens,
        new_tokens=new_tokens, gen_batch=gen_batch, cuts=cuts, seed=seed, batch_size=batch_size, max_steps=max_steps,
        max_minutes=max_minutes, lr=lr, warmup_steps=warmup_steps, threads=threads,
        checkpoint_minutes=checkpoint_minutes, log_every=log_every, progress=progress, command=_command_line(),
    )
    try:
        info = train_bita(opts, log=lambda m: typer.echo(m))
    except lm.TrainError as e:
        _fail(str(e))
    if info.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({"heldout_accuracy": info["heldout_accuracy"]["after"], "steps": info["steps"],
                           "parameters": info["parameters"], "parameter_share": info["parameter_share"], "out": str(out)}))


@train_app.command("translate-tokenizer")
def translate_tokenizer_cmd(
    data: Path = typer.Option(Path("../shared/data/multi30k_en_de"), "--data", help="Multi30k folder ({split}.{lang}.gz)."),
    out: Path = typer.Option(Path("zoo/translate/tokenizer"), "--out", help="Tokenizer output directory."),
    src_lang: str = typer.Option("en", "--src-lang"),
    tgt_lang: str = typer.Option("de", "--tgt-lang"),
    vocab_size: int = typer.Option(8000, "--vocab-size", help="Joint BPE vocabulary size (incl. <|endoftext|>)."),
) -> None:
    """Train the translation zoo's joint byte-level BPE on both sides of the train split."""
    from .tokenizer import TokenizerError
    from .trainer import TrainError
    from .translation_data import train_joint_tokenizer

    try:
        info = train_joint_tokenizer(data, out, src_lang, tgt_lang, vocab_size)
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(f"tokenizer: {out} (vocab {info['vocab_size']}, {info['val_tokens_per_word']:.2f} tokens/word on val)")


@train_app.command("seq2seq")
def seq2seq_cmd(
    out: Path = typer.Option(..., "--out", help="Run directory (checkpoint/, log.jsonl)."),
    tokenizer: Path = typer.Option(Path("zoo/translate/tokenizer"), "--tokenizer", help="Joint tokenizer directory."),
    data: Path = typer.Option(Path("../shared/data/multi30k_en_de"), "--data", help="Multi30k folder ({split}.{lang}.gz)."),
    src_lang: str = typer.Option("en", "--src-lang"),
    tgt_lang: str = typer.Option("de", "--tgt-lang"),
    preset: str = typer.Option("target", "--preset", help="Architecture: target | small (| tiny)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Where to export the fp16 model (default: <out>/export)."),
    train_targets: Optional[Path] = typer.Option(
        None, "--train-targets", help="Target-side sentences replacing the train references (distillation)."),
    init_from: Optional[Path] = typer.Option(
        None, "--init-from", help="Continue from an exported model (fresh optimizer), e.g. BiLD alignment."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Wall-clock training budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum optimizer steps."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    max_tokens: int = typer.Option(2048, "--max-tokens", help="Padded tokens per batch (the longer side)."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate."),
    warmup_steps: int = typer.Option(400, "--warmup-steps"),
    min_lr_ratio: float = typer.Option(0.05, "--min-lr-ratio", help="Final LR as a fraction of --lr."),
    weight_decay: float = typer.Option(0.01, "--weight-decay"),
    label_smoothing: float = typer.Option(0.1, "--label-smoothing"),
    dropout: float = typer.Option(0.1, "--dropout"),
    grad_clip: float = typer.Option(1.0, "--grad-clip"),
    seed: int = typer.Option(1234, "--seed"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast on CPU."),
    eval_minutes: float = typer.Option(10.0, "--eval-minutes", help="Val loss / BLEU / chrF interval (minutes)."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Eval interval in steps (overrides minutes)."),
    bleu_sentences: int = typer.Option(200, "--bleu-sentences", help="Val sources translated at each evaluation."),
    checkpoint_minutes: float = typer.Option(5.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(20, "--log-every"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: if a tty)."),
) -> None:
    """Train (or resume) a MarianMTModel translation model; export it in fp16 and score it with sacrebleu."""
    from .seq2seq import Seq2SeqOptions, train
    from .tokenizer import TokenizerError
    from .trainer import TrainError

    opts = Seq2SeqOptions(
        tokenizer=str(tokenizer), out_dir=str(out), data=str(data), src_lang=src_lang, tgt_lang=tgt_lang,
        preset=preset, export_dir=str(export) if export else None,
        train_targets=str(train_targets) if train_targets else None,
        init_from=str(init_from) if init_from else None, max_tokens=max_tokens,
        label_smoothing=label_smoothing, dropout=dropout, bleu_sentences=bleu_sentences, max_minutes=max_minutes,
        max_steps=max_steps, threads=threads, lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, bf16=bf16, eval_minutes=eval_minutes,
        eval_every_steps=eval_every, checkpoint_minutes=checkpoint_minutes, log_every=log_every, progress=progress,
        command=_command_line(),
    )
    try:
        report = train(opts, log=lambda m: typer.echo(m))
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    if report.get("stopped"):
        raise typer.Exit(130)
    typer.echo(json.dumps({"params": report["params"], "step": report["step"], "epochs": round(report["epochs"], 2),
                           **{f"{k}_bleu": v["bleu"] for k, v in report["scores"].items()},
                           **{f"{k}_chrf": v["chrf"] for k, v in report["scores"].items()}}))


@train_app.command("distill")
def distill_cmd(
    model: Path = typer.Option(Path("zoo/translate/target"), "--model", help="Exported translation model (the teacher)."),
    out: Path = typer.Option(..., "--out", help="Output text file, one translation a line (resumable: appended)."),
    data: Path = typer.Option(Path("../shared/data/multi30k_en_de"), "--data", help="Multi30k folder ({split}.{lang}.gz)."),
    split: str = typer.Option("train", "--split", help="train, val or test_2016_flickr."),
    src_lang: str = typer.Option("en", "--src-lang"),
    tgt_lang: str = typer.Option("de", "--tgt-lang"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
) -> None:
    """Sequence-level distillation data (Kim & Rush): the model's greedy translations of a split."""
    from .nat import distill
    from .tokenizer import TokenizerError
    from .trainer import TrainError, set_threads

    set_threads(threads)
    try:
        n = distill(str(model), str(data), split, str(out), src_lang, tgt_lang, log=lambda m: typer.echo(m))
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(json.dumps({"split": split, "sentences": n, "out": str(out)}))


@train_app.command("nat")
def nat_cmd(
    out: Path = typer.Option(..., "--out", help="Run directory (checkpoint/, log.jsonl)."),
    target: Path = typer.Option(Path("zoo/translate/target"), "--target",
                                help="The frozen target: a translation model, or a decoder-only LM (zoo/code/target)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Where to save the drafter (default: zoo/translate/nat, "
                                          "or zoo/code/nat for a decoder-only target)."),
    train_targets: Optional[Path] = typer.Option(None, "--train-targets", help="Translation: distilled train targets "
                                                 "(`train distill`)."),
    val_targets: Optional[Path] = typer.Option(None, "--val-targets", help="Translation: distilled val targets (default: references)."),
    data: Path = typer.Option(Path("../shared/data/multi30k_en_de"), "--data", help="Translation: Multi30k folder."),
    src_lang: str = typer.Option("en", "--src-lang"),
    tgt_lang: str = typer.Option("de", "--tgt-lang"),
    manifest: Path = typer.Option(Path("zoo/code/manifest.json"), "--manifest", help="Decoder-only: the corpus manifest."),
    work_dir: Path = typer.Option(Path("runs/nat-code"), "--work-dir", help="Decoder-only: generations and hidden states "
                                  "(`train heads`'s work dir reuses its generations)."),
    num_prompts: int = typer.Option(700, "--num-prompts", help="Decoder-only: train prompts (the target continues each)."),
    eval_prompts: int = typer.Option(80, "--eval-prompts", help="Decoder-only: held-out prompts (val split)."),
    min_prompt_tokens: int = typer.Option(32, "--min-prompt-tokens", help="Decoder-only: shortest prompt."),
    max_prompt_tokens: int = typer.Option(128, "--max-prompt-tokens", help="Decoder-only: longest prompt."),
    new_tokens: int = typer.Option(64, "--new-tokens", help="Decoder-only: greedy tokens per prompt."),
    generate_batch: int = typer.Option(64, "--generate-batch", help="Decoder-only: prompts per generate call."),
    window: int = typer.Option(64, "--window", help="Decoder-only: W, the target hidden states the drafter reads."),
    cuts: int = typer.Option(16, "--cuts", help="Decoder-only: blocks per sequence per step."),
    batch_size: int = typer.Option(8, "--batch-size", help="Decoder-only: sequences per step."),
    block_size: int = typer.Option(8, "--block-size", help="k: the most slots filled per pass (trained on 1..k)."),
    layers: int = typer.Option(2, "--layers", help="Decoder layers of the drafter."),
    glancing: bool = typer.Option(True, "--glancing/--no-glancing", help="GLAT glancing (ratio 0.5 -> 0.3)."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Wall-clock training budget."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Maximum optimizer steps."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's)."),
    max_tokens: int = typer.Option(2048, "--max-tokens", help="Translation: padded tokens per batch."),
    lr: float = typer.Option(1e-3, "--lr"),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Default: 200 (translation), 50 (decoder-only)."),
    seed: int = typer.Option(1234, "--seed"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast on CPU."),
    eval_minutes: float = typer.Option(5.0, "--eval-minutes"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Eval interval in steps (overrides minutes)."),
    checkpoint_minutes: float = typer.Option(5.0, "--checkpoint-minutes"),
    log_every: int = typer.Option(20, "--log-every"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: if a tty)."),
) -> None:
    """SpecDec's NAT drafter on a frozen target: random prefix cuts, k mask slots, glancing. A translation target's
    drafter reads its encoder states (trained on `train distill` targets); a decoder-only target's reads its own
    hidden states (trained on its greedy continuations of corpus prompts)."""
    from .tokenizer import TokenizerError
    from .trainer import TrainError

    run = dict(out_dir=str(out), block_size=block_size, layers=layers, glancing=glancing, max_minutes=max_minutes,
               max_steps=max_steps, threads=threads, lr=lr, seed=seed, bf16=bf16, eval_minutes=eval_minutes,
               eval_every_steps=eval_every, checkpoint_minutes=checkpoint_minutes, log_every=log_every,
               progress=progress, command=_command_line())
    config = target / "config.json"
    decoder_only = config.is_file() and not json.loads(config.read_text()).get("is_encoder_decoder", False)
    if decoder_only:
        from .nat_lm import NatLMOptions, train

        opts = NatLMOptions(target=str(target), export_dir=str(export or "zoo/code/nat"), manifest=str(manifest),
                            work_dir=str(work_dir), num_prompts=num_prompts, eval_prompts=eval_prompts,
                            min_prompt_tokens=min_prompt_tokens, max_prompt_tokens=max_prompt_tokens, new_tokens=new_tokens, generate_batch=generate_batch, window=window, cuts=cuts,
                            batch_size=batch_size, warmup_steps=50 if warmup_steps is None else warmup_steps, **run)
    else:
        from .nat import NatOptions, train

        if train_targets is None:
            _fail(f"--target {target} is a translation model: pass --train-targets (write them with `draftverify "
                  "train distill`)")
        opts = NatOptions(target=str(target), train_targets=str(train_targets), export_dir=str(export or "zoo/translate/nat"),
                          val_targets=str(val_targets) if val_targets else None, data=str(data), src_lang=src_lang,
                          tgt_lang=tgt_lang, max_tokens=max_tokens,
                          warmup_steps=200 if warmup_steps is None else warmup_steps, **run)
    try:
        report = train(opts, log=lambda m: typer.echo(m))
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    if report.get("stopped"):
        raise typer.Exit(130)
    if decoder_only:
        typer.echo(json.dumps({k: report[k] for k in ("params", "step", "before", "after", "bytes")}))
    else:
        typer.echo(json.dumps({k: report[k] for k in ("params", "step", "slot_loss", "accepted_per_block")}))


if __name__ == "__main__":
    train_app()
