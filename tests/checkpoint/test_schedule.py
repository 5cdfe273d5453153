"""When a periodic save is due (runner/checkpoint/schedule.py): the one rule step() and poll() both follow."""

from __future__ import annotations

import torch

from runner.checkpoint import Checkpointer
from runner.checkpoint.interval import IntervalPolicy
from runner.checkpoint.schedule import AT_STEP, ON_CLOCK, SaveSchedule


def test_every_steps_is_due_at_each_multiple_once():
    """A save is due at every every_steps-th step, and not again at a step that has a good save."""
    saved = set()
    schedule = SaveSchedule(3, IntervalPolicy(3600.0, 3600.0), saved.__contains__)
    assert [step for step in range(1, 10) if schedule.due(step)] == [3, 6, 9]
    assert schedule.due(6) == AT_STEP
    saved.add(6)
    assert schedule.due(6) is None


def test_the_interval_counts_from_the_last_save():
    """Without every_steps a save is due once the interval has passed on this process's clock; a save
    (or a restore) starts the count again."""
    policy = IntervalPolicy(3600.0, 3600.0)
    schedule = SaveSchedule(None, policy, lambda step: False)
    assert schedule.due(1) is None
    policy.fixed_s = 0.0  # from now on, due at once
    assert schedule.due(2) is None  # counted from the start, with the old period, until restarted
    schedule.restart()
    assert schedule.due(3) == ON_CLOCK
    policy.fixed_s = 3600.0
    schedule.saved(cost_s=0.01)
    assert schedule.due(4) is None


def test_step_and_poll_take_the_same_decision(tmp_path):
    """A framework's poll() says "save" exactly at the steps where step() would save, and not at a step whose
    checkpoint was already taken."""
    model = torch.nn.Linear(2, 2)
    with Checkpointer(local_dir=tmp_path / "poll", every_steps=4, model=model) as polled, \
            Checkpointer(local_dir=tmp_path / "step", every_steps=4, model=model) as stepped:
        polled_at = [step for step in range(1, 13) if polled.poll(step) is not None]
        for step in range(1, 13):
            stepped.step(step)
        assert stepped.wait()
        saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "step").glob("step-*"))
        assert polled_at == saved == [4, 8, 12]
