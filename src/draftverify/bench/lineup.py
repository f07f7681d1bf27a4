"""The runner rows of one run: the two baselines, the peers' rows (peers.py), ours from the registry (ours.py)."""

from __future__ import annotations

import torch

from ..backends.hf.cached_lm import cached_model
from ..methods import MethodOptions, build_drafter
from .config import BenchConfig
from .models import BenchModels
from .ours import plan_rows
from .peers import peer_runners
from .runner_families import BASELINE_DRAFTER
from .runners import HFRunner, Hooks, OursRunner, Runner


def build_runners(config: BenchConfig, models: BenchModels, hooks: Hooks) -> tuple[list[Runner], list[str]]:
    """The rows for this config: the two baselines, the peers', then ours from the method registry; and notes
    on what was skipped and why. With config.compile our runners share one compiled target (and draft models
    compiled the same way, through MethodOptions.compile); the peers keep the eager models."""
    target_lm = cached_model(models.target, "target", compile=config.compile)
    ours = dict(target=target_lm, hooks=hooks, eos_token_id=models.eos_token_id)
    runners: list[Runner] = [
        HFRunner(
            "hf_generate",
            "hf_generate",
            model=models.target,
            hooks=hooks,
            eos_token_id=models.eos_token_id,
            pad_token_id=models.pad_token_id,
        ),
        OursRunner(
            "ours_autoregressive",
            "ours_autoregressive",
            drafter=build_drafter(BASELINE_DRAFTER, target_lm, MethodOptions(compile=config.compile)),
            **ours,
        ),
    ]
    peers, notes = peer_runners(config, models, hooks)
    runners += peers
    try:
        ours_rows, our_notes = our_runners(config, models, hooks, target_lm, runners)
    except BaseException:
        for runner in runners:  # the peers' servers (llamacpp_native) started before a bad option or model
            runner.close()
        raise
    return runners + ours_rows, notes + our_notes


def our_runners(
    config: BenchConfig, models: BenchModels, hooks: Hooks, target_lm, others: list[Runner]
) -> tuple[list[Runner], list[str]]:
    """Our rows from the method registry on each --backend, and notes on what was skipped."""
    ours = dict(target=target_lm, hooks=hooks, eos_token_id=models.eos_token_id)
    runners: list[Runner] = []
    our_notes: list[str] = []
    if "hf" in config.backends:
        rows, hf_notes = plan_rows(config, models, target_lm)
        our_notes += hf_notes
        for row in rows:
            runners.append(
                OursRunner(
                    row.name,
                    row.family,
                    gamma=row.gamma,
                    lossless=row.lossless,
                    greedy_only=not row.lossless,
                    settings=row.settings,
                    drafter=build_drafter(row.method.drafter, target_lm, row.options),
                    verifier=row.method.verifier,
                    options=row.options,
                    **ours,
                )
            )
    if "llamacpp" in config.backends:
        llama_rows, llama_notes = llamacpp_backend_runners(config, models, hooks, others + runners)
        runners += llama_rows
        our_notes += llama_notes
    return runners, our_notes


def llamacpp_backend_runners(
    config: BenchConfig, models: BenchModels, hooks: Hooks, others: list[Runner]
) -> tuple[list[Runner], list[str]]:
    """Our loop on the llama.cpp backend: llamacpp:ours_autoregressive and every lossless method it can run, greedy,
    each checked token for token against llama.cpp's own greedy row `llamacpp` (when that row runs). The backend
    was asked for by name (--backend), so a missing converter or a model it cannot convert is an error, not a note."""
    from ..backends.llamacpp import LlamaCppLM, open_gguf

    threads = config.threads or torch.get_num_threads()
    target, _ = open_gguf(models.paths["target"], config.dtype, "target", outtype=config.target_gguf_type())
    lms = [
        LlamaCppLM(
            open_gguf(models.paths[role], config.dtype, role, outtype=config.draft_gguf)[0],
            role=role,
            threads=threads,
            flash_attn=config.llamacpp_flash_attn(),
        )
        if models.paths.get(role)
        else None
        for role in ("draft", "aligned_draft")
    ]
    target_lm = LlamaCppLM(target, role="target", threads=threads, flash_attn=config.llamacpp_flash_attn())
    reference = "llamacpp" if any(r.name == "llamacpp" for r in others) else None
    common = dict(
        target=target_lm, hooks=hooks, eos_token_id=models.eos_token_id, greedy_only=True, reference=reference
    )
    label = lambda name: f"llamacpp:{name}"  # noqa: E731
    backend = {"backend": "llamacpp", "gguf": target.path.name, "threads": threads}
    if lms[0] is not None:
        backend["draft_gguf"] = lms[0].model.path.name
    runners: list[Runner] = [
        OursRunner(
            label("ours_autoregressive"),
            "ours_autoregressive",
            settings=dict(backend),
            drafter=build_drafter(BASELINE_DRAFTER, target_lm, MethodOptions()),
            lossless=reference is not None,
            **common,
        )
    ]
    rows, notes = plan_rows(config, models, target_lm, drafts=tuple(lms))
    for row in rows:
        runners.append(
            OursRunner(
                label(row.name),
                row.family,
                gamma=row.gamma,
                lossless=reference is not None,
                settings={**row.settings, **backend},
                drafter=build_drafter(row.method.drafter, target_lm, row.options),
                verifier=row.method.verifier,
                options=row.options,
                **common,
            )
        )
    notes.append(
        "llamacpp:* rows: our loop on the llama.cpp backend (the target converted to GGUF "
        f"({target.path.name}), draft models at {config.draft_gguf}, {threads} threads), greedy; their "
        "'= baseline' is equality with llama.cpp's "
        "own greedy row `llamacpp`" + ("" if reference else " (not run here: add the llamacpp runner family)")
    )
    return runners, notes
