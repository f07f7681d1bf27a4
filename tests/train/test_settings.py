"""The run options every recipe shares: their checks, one message each."""

from __future__ import annotations

import pytest

from draftverify.train.settings import RunOptions, TrainError


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_steps=None, max_minutes=None), "give --max-steps and/or --max-minutes"),
        (dict(max_steps=0), "--max-steps must be positive"),
        (dict(max_minutes=-1.0), "--max-minutes must be positive"),
        (dict(lr=0.0), "--lr must be positive"),
        (dict(batch_size=0), "--batch-size must be positive"),
        (dict(threads=0), "--threads must be positive"),
        (dict(eval_every_steps=0), "--eval-every-steps must be positive"),
        (dict(warmup_steps=-1), "--warmup-steps must be >= 0"),
        (dict(min_lr_ratio=1.5), r"--min-lr-ratio must be in \[0, 1\]"),
        (dict(grad_clip=0.0), "--grad-clip must be positive"),
    ],
)
def test_bad_options_are_rejected(kw, message):
    with pytest.raises(TrainError, match=message):
        RunOptions(**{"max_steps": 8, **kw}).validate_run()


def test_a_required_flag_not_given_is_named():
    from draftverify.train.early_exit import EarlyExitOptions

    with pytest.raises(TrainError, match="^give --layer$"):
        EarlyExitOptions(out_dir="o", max_steps=1).validate_run()


def test_the_frozen_target_recipes_whose_losses_have_no_autocast_train_in_float32():
    from draftverify.train.bita import BitaOptions
    from draftverify.train.eagle3 import Eagle3TrainOptions
    from draftverify.train.heads import HeadsOptions
    from draftverify.train.lm import TrainOptions

    for cls in (HeadsOptions, BitaOptions, Eagle3TrainOptions):
        assert not cls(target="t", max_steps=1).use_bf16, cls.__name__
    assert TrainOptions(out_dir="o", max_steps=1).use_bf16  # the LM recipes keep bf16 autocast by default
