"""Failures no relaunch can fix end the job FAILED on the first exit, saying why in the restart log and in
`runner status`, without spending recovery.max_failures: a command not found (exit 127), a module that
cannot be imported, a CUDA out-of-memory error (raised on CPU here: the same exception type), a checkpoint that
does not fit the job's model (restored by the real library into a model of another shape)."""

from __future__ import annotations

import sys

from conftest import write_job

SECRET = "sk-live-5f3a9c"  # the job's env holds a secret, which no line of the restart log or status repeats
JOB = """
name: {name}
run: {run}
env: {{API_KEY: %s}}
resources: {{cloud: [local]}}
recovery: {{max_failures: 3, resume_drill: "off"}}
""" % SECRET

OOM = ("import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 15.77 GiB of which 20.00 MiB is free. Including non-PyTorch memory, this process has "
       "15.74 GiB memory in use.')")
# The job commits a checkpoint of one model, then restores it into a wider one, as a job whose code changed would.
MISMATCH = ("import torch; from runner.checkpoint import Checkpointer as C; "
            "c = C(model=torch.nn.Linear(4, 4), every_steps=1); c.restore(); c.step(1); c.close(); "
            "C(model=torch.nn.Linear(8, 8)).restore()")
CASES = {
    "missing-command": ("trian.py --steps 10", "command not found (exit 127)", True),
    "secret-as-command": ("'\"$API_KEY\" --steps 10'", ": ***: command not found", True),
    "missing-module": (f"{sys.executable} -c 'import no_such_module_xyz'",
                       "No module named 'no_such_module_xyz'", True),
    "out-of-memory": (f"{sys.executable} -c \"{OOM}\"", "CUDA out of memory (exit 1); 15.74 GiB in use of the "
                                                         "device's 15.77 GiB", False),
    "changed-model": (f"{sys.executable} -c \"{MISMATCH}\"", "the checkpoint does not fit the job's model (exit 1): "
                                                              "runner.checkpoint.errors.RestoreError: ", False),
}


def test_failures_no_relaunch_can_fix_end_the_job_at_once_saying_why(runner, controller, tmp_path):
    jobs = {name: runner.json("submit", str(write_job(tmp_path / name, JOB.format(name=name, run=run))))["id"]
            for name, (run, _, _) in CASES.items()}
    for name, job_id in jobs.items():
        _, words, trained_nothing = CASES[name]
        job = runner.wait_for(job_id, lambda j: j["state"] in ("FAILED", "SUCCEEDED"), timeout=180, what="the end")
        assert job["state"] == "FAILED" and job["attempts"] == 1 and job["failures"] == 1, job
        (row,) = runner.json("restarts", job_id)
        assert row["end_reason"] == "failed" and words in row["message"] and "not relaunched" in row["message"]
        if trained_nothing:
            assert row["lost_seconds"] == 0, row
        assert words in job["failure"] and f"runner logs {job_id}" in job["failure"]
        assert f"exit code {row['exit_code']}" in job["failure"]
        status = runner("status", job_id)
        assert status.returncode == 0 and "failure:" in status.stdout and words in status.stdout
        assert SECRET not in row["message"] + job["failure"] + status.stdout
