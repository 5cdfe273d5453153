"""Secrets at rest: the controller's data dir is 0700 and nothing in it is readable by group or others."""

from __future__ import annotations

import stat
from pathlib import Path

from conftest import write_job

SQLITE_ONLY = "modes of the database file and its WAL in the data dir (on Postgres the data lives in the server)"

JOB = """
name: secretive
run: echo "the job ran"
env: {API_KEY: hunter2-secret}
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_data_dir_and_everything_in_it_are_private_after_a_job(tmp_path, runner, controller, home):
    """After a job with an env secret ran, the home is 0700 and the database, its WAL, logs and workdirs are 0600."""
    job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB)))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="success")
    assert _mode(home) == 0o700
    for name in ("runner.db", "runner.db-wal", "admin-token"):
        assert _mode(home / name) == 0o600, name
    assert any(home.glob("logs/**/*.log")) and any(home.glob("workdirs/*"))
    readable = [str(p.relative_to(home)) for p in home.rglob("*") if not p.is_symlink() and _mode(p) & 0o077]
    assert readable == []
