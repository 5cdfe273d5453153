"""Multi-node jobs through the CLI, with a plain shell job: the gang's variables, refusals that name the fix."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import write_job

GANG = """
name: gang-env
run: 'echo "rank=$RUNNER_NODE_RANK of $RUNNER_NUM_NODES gpus=$RUNNER_GPUS_PER_NODE master=$RUNNER_MASTER_ADDR:$RUNNER_MASTER_PORT"; echo "$RUNNER_NODE_IPS" | sed "s/^/ip /"'
resources: {{cloud: [local], num_nodes: {nodes}, accelerators: "T4:1"}}
recovery: {{resume_drill: "off"}}
"""


@pytest.fixture
def two_node_zones(home):
    """Local zones that hold two nodes each (clouds.local.zone_capacity)."""
    config = yaml.safe_load((home / "config.yaml").read_text())
    config["clouds"]["local"]["zone_capacity"] = 2
    (home / "config.yaml").write_text(yaml.safe_dump(config))


def test_every_node_of_a_gang_gets_its_rank_the_addresses_and_one_rendezvous(tmp_path, runner, controller):
    """Both nodes print their rank, 2 nodes, 1 GPU each, node 0's address and port, and both addresses."""
    job_id = runner.json("submit", str(write_job(tmp_path / "job", GANG.format(nodes=2))))["id"]
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=90, what="the end")
    assert job["state"] == "SUCCEEDED" and job["attempts"] == 1
    node0, node1 = (runner("logs", job_id, "--node", str(rank)).stdout for rank in (0, 1))
    assert "rank=0 of 2 gpus=1" in node0 and "rank=1 of 2 gpus=1" in node1
    masters = {re.search(r"master=(\S+)", out).group(1) for out in (node0, node1)}
    assert len(masters) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", masters.pop())
    assert node0.count("ip 127.0.0.1") == 2
    (row,) = runner.json("restarts", job_id)
    assert [(n["rank"], n["end_reason"]) for n in row["nodes"]] == [(0, "succeeded"), (1, "succeeded")]


def test_more_nodes_than_a_zone_holds_are_refused_at_submit_naming_the_key(tmp_path, two_node_zones, runner,
                                                                           controller):
    """num_nodes 3 with zones of 2: exit 2, naming resources.num_nodes and the setting that bounds it."""
    result = runner("submit", str(write_job(tmp_path / "job", GANG.format(nodes=3))))
    assert result.returncode == 2
    assert "resources.num_nodes" in result.stderr and "clouds.local.zone_capacity" in result.stderr
    assert runner.json("jobs") == []


def test_preempting_a_rank_the_job_does_not_have_names_the_valid_ranks(tmp_path, runner, controller):
    """`runner preempt JOB --node 2` on a 2-node job: exit 2, naming ranks 0 to 1."""
    job_id = runner.json("submit", str(write_job(tmp_path / "job", GANG.format(nodes=2))))["id"]
    result = runner("preempt", job_id, "--node", "2")
    assert result.returncode == 2 and "0 to 1" in result.stderr
    runner("cancel", job_id)


def test_validate_and_submit_refuse_min_nodes_above_num_nodes_alike(tmp_path, runner, controller):
    """Exit 2 from both, naming resources.min_nodes and its bound; nothing is submitted."""
    path = write_job(tmp_path / "job", GANG.format(nodes="2, min_nodes: 3"))
    for command in ("validate", "submit"):
        result = runner(command, str(path))
        assert result.returncode == 2, (command, result.stderr)
        assert "resources.min_nodes" in result.stderr and "resources.num_nodes (2)" in result.stderr
    assert runner.json("jobs") == []
