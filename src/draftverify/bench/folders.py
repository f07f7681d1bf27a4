"""Where each bench suite and reproduction writes by default: benchmarks/ holds one folder per kind of
measurement, so a reader finds the speed tables apart from the cost curves, the batch and serving runs, and the
side-by-side choices."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path("benchmarks")
SPEED = BENCHMARKS / "speed"  # bench speed: every method against its peers, tokens/s and tokens per call
COST = BENCHMARKS / "cost"  # bench speed --cost-curve: the cost of scoring n tokens
BATCH = BENCHMARKS / "batch"  # bench batch
SERVING = BENCHMARKS / "serving"  # the server under load
METHODS = (
    BENCHMARKS / "methods"
)  # one method's own report: reproduce bita / blockwise / healing, bench samples / replay
TRANSLATION = BENCHMARKS / "translation"  # reproduce specdec
DRAFT_POLICY = BENCHMARKS / "draft-policy"  # bench ab over draft-length and staged-drafting options
ZOO = BENCHMARKS / "zoo"  # the zoo's own figures (held-out losses)
