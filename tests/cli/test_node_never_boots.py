"""A one-node job whose node never boots (its agent never registers: a VM stuck in boot, a bootstrap that failed)
is not left PROVISIONING, billed, for ever: past scheduler.gang_timeout the attempt ends `lost`, naming the node
and the wait, the node is terminated, and the job is relaunched within recovery.max_preemptions, then FAILED."""

from __future__ import annotations

import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from runner.providers.local.provider import LocalProvider

JOB = """
name: never-boots
run: echo never
resources: {cloud: [local]}
recovery: {max_preemptions: 1, max_failures: 0, resume_drill: "off"}
"""


def test_a_node_that_never_registers_is_given_up_and_the_job_does_not_wait_for_ever(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({
        "clouds": {"local": {"time_scale": 0.05, "boot_seconds": 86400}},  # boots in a day: never, for this test
        "scheduler": {"gang_timeout": "3s"}}))
    ctl = Controller(home).start()
    cli = Runner(home)
    cli.env.update({"RUNNER_SERVER": ctl.url, "RUNNER_TOKEN": ctl.token})
    try:
        job_id = cli.json("submit", str(write_job(tmp_path / "job", JOB)))["id"]
        job = cli.wait_for(job_id, lambda j: j["state"] in ("FAILED", "SUCCEEDED", "CANCELLED"), timeout=120,
                           what="the job to give up its nodes that never boot")
        assert job["state"] == "FAILED" and job["attempts"] == 2, job
        rows = cli.json("restarts", job_id)
        for row in rows:
            assert row["end_reason"] == "lost", row
            assert f"node {row['node']} did not register within 3s" in row["message"], row
        assert "max_preemptions" in job["message"]
        provider = LocalProvider(home)
        assert [row["node"] for row in rows if provider.describe(row["node"], None).alive] == []  # none left running
    finally:
        ctl.stop()
        kill_nodes(home)
