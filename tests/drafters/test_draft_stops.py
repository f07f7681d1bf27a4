"""DraftStops: BiLD's fallback ends a draft before a position no row is confident of; the conf stop ends it at the
first token every row has been unconfident of, a looked-up token counting as confident when lookup_confirms."""

import torch

from draftverify.drafters.draft_positions import DraftPosition
from draftverify.drafters.draft_stops import DraftStops


def position(top=None, sure=None, looked=None) -> DraftPosition:
    return DraftPosition(q=torch.zeros(1, 4), greedy=None, top=top, sure=sure, looked=looked)


def test_fallback_ends_before_a_position_no_row_is_above_alpha_fb():
    stops = DraftStops(fallback_threshold=0.5, confidence=0.0, lookup_confirms=True)
    assert not stops.falls_back(position(top=[0.2, 0.51]))  # one row above: the batch drafts on
    assert stops.falls_back(position(top=[0.2, 0.5]))  # at alpha_FB is not above it (Algorithm 1)
    assert not DraftStops(0.0, 0.0, True).falls_back(position(top=[0.0]))  # 0 never falls back


def test_conf_stop_ends_when_every_row_has_drafted_an_unconfident_token():
    stops = DraftStops(fallback_threshold=0.0, confidence=0.4, lookup_confirms=True)
    assert not stops.ends_at(position(sure=[True, False]), token=3)  # row 0 still confident
    assert not stops.ends_at(position(sure=[True, True]), token=3)  # row 1 stays stopped
    assert stops.ends_at(position(sure=[False, True]), token=3)  # now both have been unconfident


def test_a_looked_up_token_counts_as_confident_only_when_lookup_confirms_and_agrees():
    agreeing = position(sure=[False], looked=7)
    assert not DraftStops(0.0, 0.4, lookup_confirms=True).ends_at(agreeing, token=7)
    assert DraftStops(0.0, 0.4, lookup_confirms=True).ends_at(agreeing, token=8)  # lookup proposed another token
    assert DraftStops(0.0, 0.4, lookup_confirms=False).ends_at(agreeing, token=7)


def test_no_stop_rule_reads_positions_without_their_numbers():
    stops = DraftStops(fallback_threshold=0.3, confidence=0.0, lookup_confirms=True)
    assert not stops.falls_back(position())  # top not computed
    assert not stops.ends_at(position(), token=1)  # no confidence stop
