"""Output quality for the quality/latency trade-off (BiLD Figure 4): chrF against a reference and against the
target's own greedy output."""

from __future__ import annotations


def chrf(hypotheses: list[str], references: list[str]) -> float | None:
    """Corpus chrF (sacrebleu defaults: character 6-grams, beta 2) in [0, 100]; None when there is nothing to score."""
    if not hypotheses:
        return None
    try:
        from sacrebleu.metrics import CHRF
    except ImportError as err:  # pragma: no cover - sacrebleu is in the [bench] extra
        raise ImportError("draftverify bench needs sacrebleu for chrF: pip install 'draftverify[bench]'") from err
    return float(CHRF().corpus_score(hypotheses, [references]).score)
