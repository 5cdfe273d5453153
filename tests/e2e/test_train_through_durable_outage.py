"""The durable tier fails while a notice is trained through: no step that is not durable is handed over.

A job trains with periodic commits to its durable tier (the local market's: a folder under the controller's
home); at an AWS notice (24 s at the local clock's 0.2) the folder becomes unreachable (a file stands where it
was: every write and read there fails), so the emergency checkpoint the old node takes before the deadline
cannot reach it. The replacement's setup waits until the first attempt has ended and the tier is back (an
event, not a time). The next attempt must resume from the newest checkpoint that is durable, never from the
step held locally, and the restart log must say that the emergency checkpoint was not durable and why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trained_through_job import STEP, TRAINEE
from conftest import kill_nodes, write_job
from runner.checkpoint.durable import DurableTier



@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    yield path
    kill_nodes(path)


@pytest.mark.timeout(900)
def test_an_emergency_checkpoint_the_durable_tier_refused_is_not_handed_over(tmp_path, home, runner, controller):
    marker, go = tmp_path / "first-setup-done", tmp_path / "replacement-may-finish-setup"
    setup = f"if [ -e {marker} ]; then while [ ! -e {go} ]; do sleep 0.1; done; else touch {marker}; fi"
    text = (f"name: durable-outage\nsetup: {setup!r}\nrun: python train.py 300\nresources: {{cloud: [local]}}\n"
            "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")
    job_id = runner.json("submit", str(write_job(tmp_path / "job", text, {"train.py": TRAINEE})))["id"]
    runner.wait_for(job_id, lambda j: ((j.get("checkpoint") or {}).get("step") or 0) >= 30, timeout=300,
                    what="a few durable commits")
    durable, away = home / "checkpoints" / job_id, home / "checkpoints" / f"{job_id}.away"
    durable.rename(away)
    durable.write_text("the durable tier is unreachable")
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0

    runner.wait_for(job_id, lambda j: j["preemptions"] == 1, timeout=480, what="the first attempt's end")
    durable.unlink()
    away.rename(durable)
    newest_durable = DurableTier(durable.as_uri()).committed()[0]
    go.touch()
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=480, what="the end")
    first, second = runner.restarts(job_id)
    print("first attempt:", first, "\nsecond attempt:", second, "\nstatus:", job)
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1
    old_output = runner.output(job_id, 1)
    trained = int(STEP.findall(old_output)[-1])
    assert trained > newest_durable  # it trained on after the tier went: those steps are lost, not handed over
    assert first["end_reason"] == "preempted" and first["checkpoint_step"] == newest_durable
    assert second["resumed_from_step"] == newest_durable
    assert f"resumed from step {newest_durable}" in runner.output(job_id, 2)
    # The restart log says why nothing newer was handed over: the newest durable step, and the tier's failure.
    assert f"newest durable checkpoint: step {newest_durable}" in first["message"]
    assert "not saved on the durable tier" in first["message"]
    assert job["last_checkpoint_failure"]["attempt"] == 1 and "durable" in job["last_checkpoint_failure"]["message"]
