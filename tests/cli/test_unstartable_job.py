"""A job that its node cannot even start fails, saying why; it is not retried as a lost node on VM after VM."""

from __future__ import annotations

import io
import tarfile

import requests


def _workdir_with_an_absolute_link() -> bytes:
    """What an old CLI or a hand-made request could upload: a tarball holding a link to an absolute path."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        link = tarfile.TarInfo("data")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/hostname"
        tar.addfile(link)
    return buffer.getvalue()


def test_a_workdir_the_node_cannot_unpack_fails_the_attempt_with_the_reason(runner, controller):
    """The agent reports why it cannot start the job: the attempt ends failed (max_failures), never lost."""
    headers = controller.headers()
    digest = requests.put(controller.url + "/v1/workdirs", data=_workdir_with_an_absolute_link(),
                          headers=headers, timeout=10).json()["digest"]
    spec = {"name": "linked", "run": "cat data", "resources": {"cloud": ["local"]},
            "recovery": {"max_failures": 0, "max_preemptions": 1, "resume_drill": "off"}}
    job_id = requests.post(controller.url + "/v1/jobs", json={"spec": spec, "workdir_digest": digest},
                           headers=headers, timeout=10).json()["id"]
    job = runner.wait_for(job_id, lambda j: j["state"] in ("FAILED", "SUCCEEDED"), timeout=90, what="the end")
    assert job["state"] == "FAILED" and job["failures"] == 1 and job["preemptions"] == 0
    (row,) = runner.json("restarts", job_id)
    assert row["end_reason"] == "failed", row
    assert "workdir could not be unpacked" in row["message"] and "absolute" in row["message"]
    assert "workdir could not be unpacked" in runner("logs", job_id).stdout
