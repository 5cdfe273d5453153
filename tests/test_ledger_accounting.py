"""The ledger's arithmetic (runner/ledger.py) on synthetic restart-log rows: gaps, kept and redone steps, goodput."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from runner import ledger

T0 = 1_790_000_000.0


@dataclass
class Row:
    attempt: int
    first_step: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at: float | None = None
    resumed_from_step: int = 0
    num_nodes: int = 1
    world_sizes: list | None = None


def trained(attempt: int, first: int, last: int, start: float, per_step: float, resumed: int = 0,
            nodes: int = 1) -> Row:
    """An attempt that trained steps ``first``..``last`` at ``per_step`` seconds each, from ``start``."""
    return Row(attempt, first, start, last, start + (last - first) * per_step, resumed, nodes)


def test_the_gap_runs_from_the_last_step_before_an_attempt_to_its_first():
    """The first attempt has none; the next runs from its predecessor's last step; one that never trained is
    skipped over (the gap after it runs from the last step before it); an attempt yet to train has none."""
    rows = [trained(1, 1, 40, T0, 0.5),                   # last step at T0 + 19.5
            Row(2, resumed_from_step=40),                  # failed before its first step
            trained(3, 41, 100, T0 + 30.0, 0.5, resumed=40),
            Row(4, resumed_from_step=100)]                 # launched, not training yet
    assert ledger.gaps(rows) == {1: None, 2: None, 3: 10.5, 4: None}


def test_a_resume_from_the_step_trained_last_redoes_nothing():
    """An emergency checkpoint at the last step: every step is kept, and training seconds are the spans."""
    rows = [trained(1, 1, 40, T0, 0.5), trained(2, 41, 100, T0 + 30, 0.25, resumed=40)]
    assert ledger.steps_kept_and_redone(rows) == {1: (39, 0), 2: (59, 0)}
    result = ledger.goodput(rows, [(T0 - 5, T0 + 21), (T0 + 25, T0 + 46)], now=T0 + 1000)
    assert result.paid_seconds == pytest.approx(26 + 21)
    assert result.training_seconds == pytest.approx(39 * 0.5 + 59 * 0.25)
    assert result.redone_seconds == 0
    assert result.ratio == round(result.training_seconds / result.paid_seconds, 4)


def test_steps_lost_by_a_resume_from_an_older_checkpoint_are_redone_once_trained_again():
    """Attempt 1 trained to step 65 and the next resumed from 60: steps 61..65 were trained again (redone)."""
    rows = [trained(1, 1, 65, T0, 0.5), trained(2, 61, 120, T0 + 40, 0.5, resumed=60)]
    assert ledger.steps_kept_and_redone(rows) == {1: (59, 5), 2: (59, 0)}
    result = ledger.goodput(rows, [(T0 - 2, T0 + 35), (T0 + 36, T0 + 72)], now=T0 + 1000)
    assert result.redone_seconds == pytest.approx(5 * 0.5)
    assert result.training_seconds == pytest.approx((59 + 59) * 0.5)
    assert result.paid_seconds >= result.training_seconds + result.redone_seconds


def test_an_even_older_resume_later_loses_the_steps_of_every_attempt_above_it():
    """Attempt 3 resumed from step 30 (the newer checkpoints did not verify): attempt 1's steps above 30 and all
    of attempt 2's were lost; they count as redone as far as attempt 3 trained past them."""
    rows = [trained(1, 1, 50, T0, 1.0), trained(2, 51, 80, T0 + 60, 1.0, resumed=50),
            trained(3, 31, 70, T0 + 100, 1.0, resumed=30)]
    # attempt 1: 1..30 kept (29 intervals), 31..50 redone (20); attempt 2: 51..70 redone, 71..80 lost for good
    assert ledger.steps_kept_and_redone(rows) == {1: (29, 20), 2: (0, 19), 3: (39, 0)}


def test_steps_lost_when_the_job_ended_are_neither_kept_nor_redone():
    """A resume whose attempt never trained: the steps above it are lost, and nothing trained them again."""
    rows = [trained(1, 1, 40, T0, 1.0), Row(2, resumed_from_step=20)]
    assert ledger.steps_kept_and_redone(rows) == {1: (19, 0)}
    result = ledger.goodput(rows, [(T0, T0 + 50)], now=T0 + 1000)
    assert (result.training_seconds, result.redone_seconds) == (19.0, 0.0)


def test_a_gang_counts_node_seconds_and_paid_time_counts_every_node_until_its_release():
    """Two nodes training 10 s are 20 node-seconds; a standby node and a node still up (paid until now) count."""
    rows = [trained(1, 1, 11, T0, 1.0, nodes=2)]
    spans = [(T0 - 1, T0 + 12), (T0 - 1, T0 + 12), (T0 + 5, T0 + 8), (T0 + 10, None)]
    result = ledger.goodput(rows, spans, now=T0 + 20)
    assert result.training_seconds == 20.0
    assert result.paid_seconds == 13 + 13 + 3 + 10
    assert result.to_json() == {"paid_seconds": 39.0, "training_seconds": 20.0, "redone_seconds": 0.0,
                                "ratio": round(20 / 39, 4)}


def test_an_elastic_gang_counts_the_nodes_of_the_world_each_step_was_trained_in():
    """Two nodes of two ranks each; node 1 is lost at step 31 and its replacement, launched then, joins at step 81:
    steps 31..81 were trained by one node, so training is 150 node-seconds of the 200 paid, not 200."""
    row = trained(1, 1, 101, T0, 1.0, nodes=2)
    row.world_sizes = [{"step": 0, "world_size": 4}, {"step": 31, "world_size": 2}, {"step": 81, "world_size": 4}]
    spans = [(T0, T0 + 100), (T0, T0 + 30), (T0 + 30, T0 + 100)]  # node 0, node 1, the replacement
    result = ledger.goodput([row], spans, now=T0 + 1000)
    assert result.paid_seconds == 200.0
    assert result.training_seconds == 30 * 2 + 50 * 1 + 20 * 2
    assert result.ratio == 0.75


def test_nothing_paid_yet_has_no_ratio():
    """A job with no node yet: zero paid, no ratio (not a division by zero)."""
    assert ledger.goodput([], [], now=T0).to_json() == {"paid_seconds": 0.0, "training_seconds": 0.0,
                                                        "redone_seconds": 0.0, "ratio": None}


def test_boot_is_counted_from_the_launch_to_the_first_registration_only():
    """A node registering for the first time booted since its launch; one that registered before was up."""
    assert ledger.boot_seconds(T0, registered_before=False, now=T0 + 42.25) == 42.25
    assert ledger.boot_seconds(T0, registered_before=True, now=T0 + 42.25) is None
