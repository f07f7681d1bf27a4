"""``draftverify train ...`` commands.

The main CLI mounts this app with ``app.add_typer(train_app, name="train")``.
Standalone: ``python -m draftverify.train.cli tokenizer|lm|bench ...``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import typer

from ..bench.environment import command_line, reproduce_command
from ..cli_flags import settings_command
from .align import AlignOptions
from .bita import BitaOptions
from .eagle3 import Eagle3TrainOptions
from .early_exit import EarlyExitOptions
from .flags import (
    MULTI30K,
    BenchFlags,
    CorpusFlags,
    DistillFlags,
    NatFlags,
    TokenizerFlags,
    TranslateTokenizerFlags,
    values,
)
from .heads import HeadsOptions
from .lm import TrainOptions
from .ngram import NgramOptions
from .seq2seq import Seq2SeqOptions

train_app = typer.Typer(
    name="train",
    help="Train drafters (heads, BiTA, NAT, aligned or new draft models, n-gram tables) for any target on its own "
    "greedy outputs, from the code corpus or your own text (--data), on any --device; and build the code zoo.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _echo(message: str) -> None:
    """A line of the run's log on stdout, from one process only when the command runs in several (torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        typer.echo(message)


def _own_data(flags) -> dict:
    """--data as the recipe's corpus (its manifest option), read now: a missing path, an empty folder or a bad
    jsonl line is one line before any model loads."""
    if flags.data is None:
        return {}
    from .corpus import CorpusError, data_manifest

    try:
        data_manifest(flags.data)
    except CorpusError as e:
        _fail(str(e))
    return {"manifest": str(flags.data)}


def _options(flags, *leave_out: str) -> dict:
    """The flags' values as a recipe's options, --data given as its corpus."""
    return {**values(flags, "data", *leave_out), **_own_data(flags)}


def _as_run(opts):
    """A recipe's options as its command's flags made them, with --data as its corpus and the command line."""
    return dataclasses.replace(opts, **_own_data(opts), command=reproduce_command(command_line()))


def _run(recipe: Callable[..., dict], opts, *errors: type[Exception]) -> dict:
    """recipe(opts) with the run's log on stdout; its result. A TrainError (or one of `errors`) is a one-line exit 2;
    a run that stopped before its end (interrupted: its last checkpoint resumes it) exits 130."""
    from .runner import end_processes
    from .settings import TrainError

    try:
        result = recipe(opts, log=_echo)
    except (TrainError, *errors) as e:
        _fail(str(e))
    end_processes()
    if result.get("stopped"):
        raise typer.Exit(130)
    return result


@train_app.command("tokenizer")
@settings_command(TokenizerFlags)
def tokenizer_cmd(flags: TokenizerFlags) -> None:
    """Build the corpus manifest (stdlib .py files, split by file) and train the BPE tokenizer."""
    from .corpus import CorpusError
    from .tokenizer import TokenizerError, build_tokenizer_from_corpus

    out, root = flags.out, flags.root
    manifest = flags.manifest or out.parent / "manifest.json"
    if root is not None and not root.is_dir():
        _fail(f"--root {root} is not a directory")
    if not 0 <= flags.val_fraction < 1:
        _fail("--val-fraction must be in [0, 1)")
    try:
        info = build_tokenizer_from_corpus(
            out, manifest, vocab_size=flags.vocab_size, root=root, val_fraction=flags.val_fraction
        )
    except (CorpusError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(
        f"manifest: {manifest} ({info['counts']['train']} train / {info['counts']['val']} val files, "
        f"sha256 {info['manifest_files_sha256'][:16]})"
    )
    typer.echo(f"tokenizer: {out} (vocab {info['vocab_size']}, {info['val_chars_per_token']:.2f} chars/token on val)")


CODE_PACKAGES = (
    "django==5.2.19",
    "flask==3.1.3",
    "requests==2.34.2",
    "click==8.5.1",
    "attrs==26.1.0",
    "pytest==9.2.0",
    "rich==15.0.0",
    "networkx==3.6.1",
    "sympy==1.14.0",
    "numpy==2.4.6",
    "scikit-learn==1.9.1",
    "pandas==3.1.1",
    "scipy==1.17.1",
    "matplotlib==3.11.2",
    "sqlalchemy==2.1.9",
    "jinja2==3.1.6",
    "werkzeug==3.1.9",
    "pip==26.3",
    "setuptools==84.2.1",
    "black==26.10.1",
    "tornado==6.6.1",
    "pygments==2.21.0",
    "sphinx==9.0.4",
    "astropy==8.0.2",
    "statsmodels==0.15.0",
    "pyyaml==6.0.3",
    "urllib3==2.8.0",
    "aiohttp==3.14.5",
    "fastapi==0.165.0",
    "pydantic==2.14.3",
    "starlette==1.10.0",
    "httpx==0.28.1",
    "transformers==5.23.0",
    "boto3==1.44.5",
    "botocore==1.44.5",
    "twisted==26.10.0",
    "typer==0.29.2",
    "more-itertools==11.2.1",
    "toolz==1.2.0",
    "dask==2026.8.0",
    "xarray==2026.9.0",
    "seaborn==0.13.2",
    "pillow==13.0.0",
)


@train_app.command("corpus")
@settings_command(CorpusFlags)
def corpus_cmd(flags: CorpusFlags) -> None:
    """Build the code corpus: the stdlib plus permissively licensed PyPI packages, licence per file, deduplicated."""
    from .corpus import CorpusError, build_manifest
    from .packages import fetch_wheels, unpack_sources

    out, wheel_dir = flags.out, flags.wheel_dir
    if not 0 <= flags.val_fraction < 1:
        _fail("--val-fraction must be in [0, 1)")
    try:
        if flags.download:
            fetch_wheels(list(flags.package or CODE_PACKAGES), wheel_dir)
        if not wheel_dir.is_dir():
            _fail(f"--wheel-dir {wheel_dir} does not exist; run without --no-download")
        used = unpack_sources(wheel_dir, flags.src_root)
        sources = [
            {
                "dir": f"{u.name}-{u.version}" if u.wheel else f"cpython-{u.version}",
                "name": u.name,
                "version": u.version,
                "license": u.license,
                "wheel": u.wheel,
            }
            for u in used
        ]
        m = build_manifest(out, root=flags.src_root, val_fraction=flags.val_fraction, sources=sources)
    except CorpusError as e:
        _fail(str(e))
    typer.echo(
        f"manifest: {out} ({m['counts']['train']} train / {m['counts']['val']} val files, "
        f"{(m['bytes']['train'] + m['bytes']['val']) / 1e6:.1f} MB, {len(sources)} sources, "
        f"{len(m['skipped'])} skipped)"
    )


@train_app.command("lm")
@settings_command(TrainOptions, leave_out=("dtype",))  # no frozen model to set the precision of
def lm_cmd(opts: TrainOptions) -> None:
    """Train (or resume) a LlamaForCausalLM from scratch on the code corpus and export it in fp16."""
    from . import lm

    if opts.preset not in lm.PRESETS:
        _fail(f"unknown preset {opts.preset!r}; choose one of: {', '.join(lm.PRESETS)}")
    opts = _as_run(opts)
    try:
        summary = lm.train(opts, log=_echo)
    except lm.TrainError as e:
        _fail(str(e))
    except MemoryError:
        _fail("out of memory; lower --batch-size or --seq-len")
    if summary.get("stopped"):
        raise typer.Exit(130)
    _echo(
        json.dumps(
            {k: summary[k] for k in ("params", "step", "tokens_seen", "val_loss", "tokens_per_s") if k in summary}
        )
    )


@train_app.command("early-exit")
@settings_command(EarlyExitOptions, leave_out=("dtype",))  # the target trains: float32
def early_exit_cmd(opts: EarlyExitOptions) -> None:
    """BiLD early exit (section 4.4): fine-tune the target with the averaged loss of layer L and the last layer."""
    from .early_exit import train_early_exit

    info = _run(train_early_exit, _as_run(opts))
    typer.echo(
        json.dumps(
            {
                "layer": info["layer"],
                "full_before": info["before"]["full"],
                "full_after": info["after"]["full"],
                "early_before": info["before"]["early"],
                "early_after": info["after"]["early"],
                "degradation": info["degradation"],
                "steps": info["step"],
                "out": info["out_dir"],
            }
        )
    )


@train_app.command("bench")
@settings_command(BenchFlags)
def bench_cmd(flags: BenchFlags) -> None:
    """Measure seconds/step of fp32 vs bf16 autocast training on this machine."""
    from .presets import PRESETS, bench_step_time

    if flags.preset not in PRESETS:
        _fail(f"unknown preset {flags.preset!r}; choose one of: {', '.join(PRESETS)}")
    typer.echo(
        json.dumps(bench_step_time(flags.preset, flags.batch_size, flags.seq_len, flags.threads, flags.steps), indent=1)
    )


@train_app.command("ngram")
@settings_command(NgramOptions)
def ngram_cmd(opts: NgramOptions) -> None:
    """Build the n-gram drafter's table from the corpus training split (or target generations)."""
    from .ngram import build

    summary = _run(build, _as_run(opts))
    typer.echo(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "contexts",
                    "entries",
                    "bytes",
                    "tokens",
                    "val_top1_accuracy",
                    "generations_top1_accuracy",
                    "seconds_total",
                )
                if k in summary
            }
        )
    )


@train_app.command("align")
@settings_command(AlignOptions)
def align_cmd(opts: AlignOptions) -> None:
    """BiLD prediction alignment: fine-tune the draft on the target's greedy outputs; report alpha before/after."""
    from .align import align
    from .settings import TrainError

    opts = _as_run(opts)
    try:
        info = align(opts, log=_echo)
    except TrainError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("interrupted; finished generations are cached: run the same command again to resume", err=True)
        raise typer.Exit(130)
    if info.get("stopped"):
        raise typer.Exit(130)
    typer.echo(
        json.dumps(
            {
                "alpha_before": (info["before"] or {}).get("alpha"),
                "alpha_after": (info["after"] or {}).get("alpha"),
                "tokens_per_call_before": (info["before"] or {}).get("tokens_per_call"),
                "tokens_per_call_after": (info["after"] or {}).get("tokens_per_call"),
                "steps": info["finetune"]["step"],
                "out": info["out_dir"],
            }
        )
    )


# the recipes on a frozen target measure held-out accuracy before and after, not a held-out loss during the run
NO_HELD_OUT_LOSS = ("eval_every_steps", "eval_minutes")


def _frozen_recipe(recipe: Callable[..., dict], opts, measure: str, *figures: str) -> None:
    """Run a frozen-target recipe on its command's options (_as_run) and print one JSON line: its held-out
    `measure` after training, its steps, the `figures` of its result and where it saved what it trained."""
    opts = _as_run(opts)
    info = _run(recipe, opts)
    summary = {measure: info[measure]["after"], "steps": info["steps"], **{name: info[name] for name in figures}}
    typer.echo(json.dumps({**summary, "out": str(opts.out_dir)}))


@train_app.command("heads")
@settings_command(HeadsOptions, leave_out=NO_HELD_OUT_LOSS)
def heads_cmd(opts: HeadsOptions) -> None:
    """Blockwise parallel decoding heads on a frozen target, trained on its own greedy continuations."""
    from .heads import train_heads

    _frozen_recipe(train_heads, opts, "heldout_accuracy")


@train_app.command("eagle3")
@settings_command(Eagle3TrainOptions, leave_out=NO_HELD_OUT_LOSS)
def eagle3_cmd(opts: Eagle3TrainOptions) -> None:
    """An EAGLE-3 head on a frozen target's own features, trained on its greedy tokens with a training-time test."""
    from .eagle3 import train_eagle3

    _frozen_recipe(train_eagle3, opts, "heldout_acceptance")


@train_app.command("bita")
@settings_command(BitaOptions, leave_out=NO_HELD_OUT_LOSS)
def bita_cmd(opts: BitaOptions) -> None:
    """BiTA mask and prompt tokens on a frozen target, trained on its own greedy continuations (SAR loss)."""
    from .bita import train_bita

    _frozen_recipe(train_bita, opts, "heldout_accuracy", "parameters", "parameter_share")


@train_app.command("translate-tokenizer")
@settings_command(TranslateTokenizerFlags)
def translate_tokenizer_cmd(flags: TranslateTokenizerFlags) -> None:
    """Train the translation zoo's joint byte-level BPE on both sides of the train split."""
    from .settings import TrainError
    from .tokenizer import TokenizerError
    from .translation_data import train_joint_tokenizer

    try:
        info = train_joint_tokenizer(flags.data, flags.out, flags.src_lang, flags.tgt_lang, flags.vocab_size)
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(
        f"tokenizer: {flags.out} (vocab {info['vocab_size']}, {info['val_tokens_per_word']:.2f} tokens/word on val)"
    )


@train_app.command("seq2seq")
@settings_command(Seq2SeqOptions, leave_out=("batch_size", "device", "dtype"))  # batches by tokens, on the CPU
def seq2seq_cmd(opts: Seq2SeqOptions) -> None:
    """Train (or resume) a MarianMTModel translation model; export it in fp16 and score it with sacrebleu."""
    from .seq2seq import train
    from .tokenizer import TokenizerError

    report = _run(train, dataclasses.replace(opts, command=reproduce_command(command_line())), TokenizerError)
    typer.echo(
        json.dumps(
            {
                "params": report["params"],
                "step": report["step"],
                "epochs": round(report["epochs"], 2),
                **{f"{k}_bleu": v["bleu"] for k, v in report["scores"].items()},
                **{f"{k}_chrf": v["chrf"] for k, v in report["scores"].items()},
            }
        )
    )


@train_app.command("distill")
@settings_command(DistillFlags)
def distill_cmd(flags: DistillFlags) -> None:
    """Sequence-level distillation data (Kim & Rush): the model's greedy translations of a split."""
    from .nat import distill
    from .settings import TrainError, set_threads
    from .tokenizer import TokenizerError

    set_threads(flags.threads)
    try:
        n = distill(
            str(flags.model),
            str(flags.data),
            flags.split,
            str(flags.out),
            flags.src_lang,
            flags.tgt_lang,
            log=_echo,
        )
    except (TrainError, TokenizerError) as e:
        _fail(str(e))
    typer.echo(json.dumps({"split": flags.split, "sentences": n, "out": str(flags.out)}))


# the nat command's flags that only one kind of target reads (--data: both, as their corpus)
NAT_TRANSLATION_ONLY = ("train_targets", "val_targets", "data", "src_lang", "tgt_lang", "max_tokens")
NAT_DECODER_ONLY = (
    "manifest",
    "work_dir",
    "num_prompts",
    "eval_prompts",
    "min_prompt_tokens",
    "max_prompt_tokens",
    "new_tokens",
    "generate_batch",
    "data_seed",
    "window",
    "cuts",
    "batch_size",
)


@train_app.command("nat")
@settings_command(NatFlags)
def nat_cmd(flags: NatFlags, given: frozenset[str]) -> None:
    """SpecDec's NAT drafter on a frozen target: random prefix cuts, k mask slots, glancing. A translation target's
    drafter reads its encoder states (trained on `train distill` targets); a decoder-only target's reads its own
    hidden states (trained on its greedy continuations of corpus prompts)."""
    from .tokenizer import TokenizerError

    target, warmup = flags.target, flags.warmup_steps
    config = target / "config.json"
    decoder_only = config.is_file() and not json.loads(config.read_text()).get("is_encoder_decoder", False)
    unread = NAT_TRANSLATION_ONLY if decoder_only else NAT_DECODER_ONLY
    unread_given = [name for name in unread if name != "data" and name in given]
    if unread_given:
        kind = "a decoder-only LM" if decoder_only else "a translation model"
        names = ", ".join("--" + name.replace("_", "-") for name in unread_given)
        _fail(f"--target {target} is {kind}: its NAT recipe does not read {names} (leave them out)")
    if decoder_only:
        from .nat_lm import NatLMOptions, train

        opts = NatLMOptions(
            **_options(flags, *NAT_TRANSLATION_ONLY, "export_dir", "warmup_steps"),
            export_dir=str(flags.export_dir or "zoo/code/nat"),
            warmup_steps=50 if warmup is None else warmup,
            command=reproduce_command(command_line()),
        )
    else:
        from .nat import NatOptions, train

        if flags.device != "cpu":
            _fail(f"--target {target} is a translation model: its NAT recipe runs on the CPU (use --device cpu)")
        if flags.train_targets is None:
            _fail(
                f"--target {target} is a translation model: pass --train-targets (write them with `draftverify "
                "train distill`)"
            )
        opts = NatOptions(
            **values(flags, *NAT_DECODER_ONLY, "export_dir", "warmup_steps", "data"),
            data=str(flags.data or MULTI30K),
            export_dir=str(flags.export_dir or "zoo/translate/nat"),
            warmup_steps=200 if warmup is None else warmup,
            command=reproduce_command(command_line()),
        )
    report = _run(train, opts, TokenizerError)
    if decoder_only:
        typer.echo(json.dumps({k: report[k] for k in ("params", "step", "before", "after", "bytes")}))
    else:
        typer.echo(json.dumps({k: report[k] for k in ("params", "step", "slot_loss", "accepted_per_block")}))


if __name__ == "__main__":
    train_app()
