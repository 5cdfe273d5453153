"""When a periodic checkpoint is due: fixed durations, and Young/Daly for interval='auto'."""

from __future__ import annotations

import math

import pytest

from runner.checkpoint.interval import FIRST_INTERVAL_S, IntervalPolicy, mtbf_from_env, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m", 600), ("1h", 3600), ("1h30m", 5400),
                                                (45, 45), ("2.5", 2.5)])
def test_durations_parse(text, seconds):
    """Duration strings and plain numbers become seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "10 parsecs", "", 0, -5, "0s"])
def test_bad_durations_are_refused(text):
    """Malformed or non-positive intervals raise ValueError with an example."""
    with pytest.raises(ValueError, match="30s"):
        parse_duration(text)


def test_auto_follows_young_daly():
    """T = sqrt(2*C*M) when that is above the floors."""
    policy = IntervalPolicy(None, mtbf_s=6 * 3600)
    policy.record(cost_s=1.0, commit_s=5.0)
    assert policy.period() == pytest.approx(math.sqrt(2 * 1.0 * 6 * 3600))


def test_auto_is_never_shorter_than_one_save_and_upload():
    """A slow upload stretches the period to the commit time."""
    policy = IntervalPolicy(None, mtbf_s=3600)
    policy.record(cost_s=0.01, commit_s=400.0)
    assert policy.period() == 400.0


def test_auto_keeps_the_overhead_under_one_percent():
    """The period is at least 100 times the blocking cost."""
    policy = IntervalPolicy(None, mtbf_s=60)
    policy.record(cost_s=2.0, commit_s=1.0)
    assert policy.period() == pytest.approx(200.0)


def test_auto_before_any_measurement_uses_the_first_interval():
    """With nothing measured yet the first interval applies."""
    assert IntervalPolicy(None, 3600).period() == FIRST_INTERVAL_S


def test_mtbf_comes_from_the_environment(monkeypatch):
    """RUNNER_MTBF_SECONDS overrides the 6 h default."""
    monkeypatch.setenv("RUNNER_MTBF_SECONDS", "7200")
    assert mtbf_from_env() == 7200
