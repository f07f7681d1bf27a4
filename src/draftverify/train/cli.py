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


@train_app.command("bench")
def bench_cmd(
    preset: str = typer.Option("target", "--preset"),
    batch_size: int = typer.Option(4, "--batch-size"),
    seq_len: int = typer.Option(512, "--seq-len"),
    threads: int = typer.Option(1, "--threads"),
    steps: int = typer.Option(4, "--steps"),
) -> None:
    """Measure seconds/step of fp32 vs bf16 autocast training on this machine."""
    from . import lm

    if preset not in lm.PRESETS:
        _fail(f"unknown preset {preset!r}; choose one of: {', '.join(lm.PRESETS)}")
    typer.echo(json.dumps(lm.bench_step_time(preset, batch_size, seq_len, threads, steps), indent=1))


if __name__ == "__main__":
    train_app()
