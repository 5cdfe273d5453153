"""Retention under the runner: what ``keep`` never deletes, and restores that fall short of the handed-over step."""

from __future__ import annotations

import shutil
import time

from structlog.testing import capture_logs

from runner.checkpoint.durable import DurableTier
from runner.checkpoint.manifest import Manifest

from .test_control import agent  # noqa: F401 - the fixture: a test-side agent on the control socket


def _commit(tier: DurableTier, step: int, attempt: int | None) -> None:
    tier.fs.makedirs(tier.location(step), exist_ok=True)
    tier.write_manifest(Manifest(step, [], "xxh3_128", attempt=attempt, job_id="job-1"))


def test_the_step_the_controller_recorded_is_kept_whatever_keep_says(setup, tmp_path, agent):  # noqa: F811
    """keep: 1, and the agent says the controller recorded step 10: a node that can no longer report goes on
    committing 20 and 30, and step 10 (what the controller would hand the next attempt) is still there."""
    durable = tmp_path / "durable"
    ckpt = setup.checkpointer(tmp_path / "local", durable_url=f"file://{durable}", keep=1)
    ckpt.restore()
    ckpt.save(10)
    assert ckpt.wait()
    agent.send({"op": "recorded", "step": 10})
    deadline = time.monotonic() + 60
    while 10 not in ckpt._retention.protected() and time.monotonic() < deadline:
        time.sleep(0.01)
    for step in (20, 30):
        setup.train(1)
        ckpt.save(step)
        assert ckpt.wait()
    ckpt.close()
    assert sorted(p.name for p in durable.glob("step-*")) == ["step-00000010", "step-00000030"]
    assert sorted(p.name for p in (tmp_path / "local").glob("step-*")) == ["step-00000010", "step-00000030"]


def test_a_missing_handed_over_step_falls_back_to_the_newest_older_one_loudly(setup, tmp_path, monkeypatch):
    """The controller handed over step 20, which is gone; 10 (older) and 30 (newer) are committed: the restore
    takes 10, never 30 and never 0, and says at error level that 20 was missing."""
    durable = f"file://{tmp_path / 'durable'}"
    ckpt = setup.checkpointer(tmp_path / "first", durable_url=durable, keep=5)
    for step in (10, 20, 30):
        ckpt.save(step)
        assert ckpt.wait()
        setup.train(1)
    ckpt.close()
    shutil.rmtree(tmp_path / "durable" / "step-00000020")
    monkeypatch.setenv("RUNNER_RESUME_STEP", "20")
    with capture_logs() as logs:
        resumed = setup.checkpointer(tmp_path / "second", durable_url=durable)
        assert resumed.restore() == 10
        resumed.close()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert errors and errors[0]["handed_over"] == 20 and errors[0]["resumed"] == 10, logs


def test_durable_retention_keeps_a_newer_attempts_checkpoints_and_removes_a_superseded_ones(tmp_path):
    """Attempt 2 resumed from 20 (handed over): attempt 1's 25 and 28, written after the job moved on, are
    removed rather than counted as newest; attempt 3's 40 is never touched; keep 1 of attempt 2's own plus the
    protected 20. Once attempt 3 has marked the folder, attempt 2 prunes nothing."""
    tier = DurableTier(f"file://{tmp_path / 'durable'}")
    for step, attempt in ((10, 1), (20, 1), (25, 1), (28, 1), (22, 2), (24, 2), (40, 3)):
        _commit(tier, step, attempt)
    removed = tier.prune(1, attempt=2, protect=frozenset({20}), stale_above=20, job_id="job-1")
    assert sorted(removed) == [10, 22, 25, 28]
    assert tier.committed() == [40, 24, 20]
    _commit(tier, 26, 2)
    tier.mark_attempt(2, "job-1")
    tier.mark_attempt(7, "job-0")  # an earlier job with the same URL: not an attempt of this one
    assert tier.newest_attempt("job-1") == 2
    assert tier.prune(1, attempt=2, protect=frozenset({20}), stale_above=20, job_id="job-1") == [24]
    tier.mark_attempt(3, "job-1")
    assert tier.newest_attempt("job-1") == 3
    _commit(tier, 27, 2)
    assert tier.prune(1, attempt=2, protect=frozenset({20}), stale_above=20, job_id="job-1") == []
    assert tier.committed() == [40, 27, 26, 20]
