"""`submit --follow` keeps output and state lines in the order they happened: an attempt's output before the
state change that ended it and the next attempt's lines, and the last attempt's output before the job's end."""

from __future__ import annotations

import subprocess
import sys

from conftest import write_job

FLAKY = """
name: flaky
run: echo "output of attempt $RUNNER_ATTEMPT"; exit 3
resources: {cloud: [local]}
recovery: {max_failures: 1, resume_drill: "off"}
"""


def test_follow_prints_each_attempts_output_before_what_came_after_it(tmp_path, runner, controller):
    job = write_job(tmp_path / "job", FLAKY)
    result = subprocess.run([sys.executable, "-m", "runner.cli.main", "submit", str(job), "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                            env=runner.env, cwd=runner.home)
    out = result.stdout
    assert result.returncode == 1, out
    order = ["===== attempt 1", "output of attempt 1", "Z RECOVERING:", "===== attempt 2", "output of attempt 2",
             "Z FAILED:", "its restart log"]
    where = [out.find(text) for text in order]
    assert all(i >= 0 for i in where) and where == sorted(where), out
