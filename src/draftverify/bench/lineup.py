"""The runner rows of one run: the two baselines, the peers' rows (peers.py), ours from the registry (ours.py)."""
from __future__ import annotations

from ..cached_lm import cached_model
from ..methods import MethodOptions, build_drafter
from .config import BenchConfig
from .models import BenchModels
from .ours import BASELINE_DRAFTER, plan_rows
from .peers import peer_runners
from .runners import HFRunner, Hooks, OursRunner, Runner


def build_runners(config: BenchConfig, models: BenchModels, hooks: Hooks) -> tuple[list[Runner], list[str]]:
    """The rows for this config: the two baselines, the peers', then ours from the method registry; and notes
    on what was skipped and why. With config.compile our runners share one compiled target (and draft models
    compiled the same way, through MethodOptions.compile); the peers keep the eager models."""
    target_lm = cached_model(models.target, "target", compile=config.compile)
    ours = dict(target=target_lm, hooks=hooks, eos_token_id=models.eos_token_id)
    runners: list[Runner] = [
        HFRunner("hf_generate", "hf_generate", model=models.target, hooks=hooks, eos_token_id=models.eos_token_id,
                 pad_token_id=models.pad_token_id),
        OursRunner("ours_autoregressive", "ours_autoregressive",
                   drafter=build_drafter(BASELINE_DRAFTER, target_lm, MethodOptions(compile=config.compile)), **ours),
    ]
    peers, notes = peer_runners(config, models, hooks)
    rows, our_notes = plan_rows(config, models, target_lm)
    runners += peers
    for row in rows:
        runners.append(OursRunner(
            row.name, row.family, gamma=row.gamma, lossless=row.lossless, greedy_only=not row.lossless,
            settings=row.settings, drafter=build_drafter(row.method.drafter, target_lm, row.options),
            verifier=row.method.verifier, options=row.options, **ours))
    return runners, notes + our_notes
