"""The job file's checkpoint.interval and checkpoint.keep reach a Checkpointer() built without them (docs/job-file.md).

The agent exports them as RUNNER_CHECKPOINT_INTERVAL (absent for auto) and RUNNER_CHECKPOINT_KEEP; a value
given in code wins, and one log line names both values.
"""

from __future__ import annotations

import time

import pytest
import structlog
import torch

from runner.checkpoint import Checkpointer, CheckpointConfigError, job_settings


def committed(root) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "manifest.json").is_file())


@pytest.fixture(autouse=True)
def _forget_what_was_told(monkeypatch):
    monkeypatch.setattr(job_settings, "_told", set())


def test_interval_2s_from_the_job_file_commits_several_checkpoints_two_seconds_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_INTERVAL", "2s")
    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(local_dir=tmp_path, model=model)
    step, times, deadline = 0, {}, time.monotonic() + 120
    while len(committed(tmp_path)) < 3 and time.monotonic() < deadline:
        step += 1
        ckpt.step(step)
        if ckpt._last_job is not None and ckpt._last_job.step not in times:
            # when the save began, on the library's clock: a time read here, after step() returned, could be
            # late by however long this thread was paused
            times[ckpt._last_job.step] = ckpt._last_job.started
        time.sleep(0.01)
    ckpt.close()
    steps = committed(tmp_path)
    assert len(steps) == 3, steps
    stamps = [times[s] for s in steps]
    assert all(later - earlier >= 2.0 for earlier, later in zip(stamps, stamps[1:]))


def test_interval_1h_from_the_job_file_commits_nothing_during_a_short_run(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_INTERVAL", "1h")
    ckpt = Checkpointer(local_dir=tmp_path, model=torch.nn.Linear(2, 2))
    for step in range(1, 201):
        ckpt.step(step)
    ckpt.close()
    assert committed(tmp_path) == []


def test_keep_2_from_the_job_file_keeps_two_checkpoints_on_both_tiers(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_KEEP", "2")
    durable = tmp_path / "durable"
    ckpt = Checkpointer(local_dir=tmp_path / "local", durable_url=f"file://{durable}", model=torch.nn.Linear(2, 2))
    for step in (1, 2, 3, 4):
        ckpt.save(step)
        assert ckpt.wait()
    ckpt.close()
    assert committed(tmp_path / "local") == [3, 4]
    assert committed(durable) == [3, 4]


def test_a_value_given_in_code_wins_and_one_line_names_both(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_INTERVAL", "2s")
    monkeypatch.setenv("RUNNER_CHECKPOINT_KEEP", "5")
    with structlog.testing.capture_logs() as logs:
        first = Checkpointer(local_dir=tmp_path / "a", interval="10m", keep=1, model=torch.nn.Linear(2, 2))
        second = Checkpointer(local_dir=tmp_path / "b", interval="10m", keep=1, model=torch.nn.Linear(2, 2))
    first.close()
    second.close()
    assert first._policy.period() == 600 and first.keep == 1
    told = [entry["event"] for entry in logs if "job file" in entry["event"]]
    assert told == ["checkpoint interval: the code's '10m' is used, not the job file's '2s'",
                    "checkpoint keep: the code's 1 is used, not the job file's 5"]


def test_the_same_value_in_code_and_job_file_says_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_INTERVAL", "120")
    with structlog.testing.capture_logs() as logs:
        ckpt = Checkpointer(local_dir=tmp_path, interval="2m", model=torch.nn.Linear(2, 2))
    ckpt.close()
    assert ckpt._policy.period() == 120
    assert not [entry for entry in logs if "job file" in entry["event"]]


def test_without_the_job_file_the_defaults_stay(tmp_path):
    ckpt = Checkpointer(local_dir=tmp_path, model=torch.nn.Linear(2, 2))
    ckpt.close()
    assert ckpt.keep == 3 and ckpt._policy.fixed_s is None  # auto


def test_a_malformed_job_file_value_is_ignored_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_INTERVAL", "soon")
    monkeypatch.setenv("RUNNER_CHECKPOINT_KEEP", "0")
    with structlog.testing.capture_logs() as logs:
        ckpt = Checkpointer(local_dir=tmp_path, model=torch.nn.Linear(2, 2))
    ckpt.close()
    assert ckpt.keep == 3 and ckpt._policy.fixed_s is None
    warnings = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert any("RUNNER_CHECKPOINT_INTERVAL='soon'" in w for w in warnings)
    assert any("RUNNER_CHECKPOINT_KEEP='0'" in w for w in warnings)


def test_a_bad_value_in_code_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CHECKPOINT_KEEP", "2")
    with pytest.raises(CheckpointConfigError, match="keep"):
        Checkpointer(local_dir=tmp_path, keep=0, model=torch.nn.Linear(2, 2))
