"""DraftForwards and StagedForwards: one forward per draft token, or staged drafting, where the positions after
the looked-up tokens the draft chose come out of the same forward and the cache drops the rest."""

import torch

from draftverify.drafters.draft_positions import DraftForwards, PositionNeeds, StagedForwards, position_needs
from draftverify.types import SamplingParams, TargetOutput

VOCAB = 6


class ScriptedLM:
    """A draft LM whose next token after token t is (t + 1) % VOCAB, certainly; it records its forwards, the
    logits each asked for and its rollbacks, and keeps a cache length."""

    def __init__(self):
        self.length = 0
        self.fed: list[list[int]] = []
        self.kept: list[int] = []
        self.rollbacks: list[int] = []

    def forward(self, tokens, new_valid=None, logits_to_keep=0):
        ids = tokens[0].tolist()
        self.fed.append(ids)
        self.kept.append(logits_to_keep)
        self.length += len(ids)
        logits = torch.full((1, len(ids), VOCAB), -10.0)
        for i, t in enumerate(ids):
            logits[0, i, (t + 1) % VOCAB] = 10.0
        return TargetOutput(logits=logits[:, len(ids) - logits_to_keep :] if logits_to_keep else logits)

    def rollback(self, length):
        self.rollbacks.append(length)
        self.length = length


class Drafter:
    def __init__(self, pending):
        self.lm = ScriptedLM()
        self.forward_calls = 0
        self.pending = pending

    def unseen(self, state):
        return torch.tensor([self.pending]), None


class State:
    params = SamplingParams()
    device = torch.device("cpu")

    def __init__(self, text):
        self.text = text

    def row_ids(self, b):
        return self.text


NEEDS = PositionNeeds(greedy=True, top=True, confidence=0.0)


def test_one_forward_per_draft_token_feeding_the_token_drawn():
    drafter = Drafter([1, 2])
    forwards = DraftForwards(drafter, State([0, 1, 2]), NEEDS)
    first = forwards.next(3)
    assert first.greedy == [3] and first.top is not None and first.top[0] > 0.99 and first.sure is None
    forwards.took(first.greedy, 3)
    second = forwards.next(2)
    assert second.greedy == [4]
    assert drafter.lm.fed == [[1, 2], [3]] and drafter.forward_calls == 2
    assert drafter.lm.kept == [1, 1]  # the catch-up's first token is fed, its logits neither read nor made


def test_staged_positions_after_chosen_looked_up_tokens_cost_no_forward(monkeypatch):
    drafter = Drafter([2])
    monkeypatch.setattr(StagedForwards, "_looked_up", lambda self, room: [3, 4, 0][: room - 1])  # 0 != draft's 5
    forwards = StagedForwards(drafter, State([0, 1, 2]), NEEDS, lookup_tokens=3, ngrams=(3, 1))
    tokens = []
    for room in (6, 5, 4, 3):
        position = forwards.next(room)
        tokens.append(position.greedy[0])
        forwards.took(position.greedy, position.greedy[0])
    forwards.finish()
    assert tokens == [3, 4, 5, 0]  # the draft's own choices, whatever lookup said
    # first forward: pending 2 and the looked-up 3, 4, 0; the draft chose 3 and 4, then 5 (not 0): positions 1-3 came
    # from it, and the cache dropped the looked-up 0 before the next forward fed 5
    assert drafter.lm.fed[0] == [2, 3, 4, 0] and drafter.lm.fed[1][0] == 5
    assert drafter.lm.rollbacks[0] == 3  # held 0 + pending 1 + kept 2
    assert drafter.lm.kept[0] == 4  # the pending token's and each looked-up one's
    assert drafter.forward_calls == 2
    assert forwards.text[-4:] == [3, 4, 5, 0]


def test_needs_follow_the_sampling_settings_and_stop_rules():
    assert position_needs(SamplingParams(), 0.0, 0.0) == PositionNeeds(greedy=True, top=False, confidence=0.0)
    assert position_needs(SamplingParams(temperature=1.0), 0.2, 0.4) == PositionNeeds(False, True, 0.4)
