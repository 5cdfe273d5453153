"""The names the processes share: the job's RUNNER_* variables, actions, end reasons, states."""

from __future__ import annotations

import json

from runner.protocol import environment as env
from runner.protocol.actions import JOB_STOPPING_ACTIONS, Action
from runner.protocol.events import AGENT_EXIT_REASONS, ATTEMPT_END_REASONS, EndReason
from runner.protocol.states import JobState, NodeState
from runner.scheduler import states

ASSIGNMENT = {
    "job_id": "j-1", "attempt": 3,
    "checkpoint": {"durable_url": "s3://b/j-1", "local_dir": None, "interval": "10m", "keep": 2,
                   "resume": {"step": 400}},
    "gang": {"num_nodes": 2, "node_rank": 1, "node_ips": ["10.0.0.1", "10.0.0.2"], "master_addr": "10.0.0.1",
             "master_port": 29611, "gpus_per_node": 8},
    "placement": {"cloud": "aws", "zone": "us-east-1a", "instance_type": "p4d.24xlarge", "spot": True},
}


def test_an_assignment_becomes_the_jobs_variables():
    assert env.job_environment(ASSIGNMENT, "/scratch/ckpt", "/run/runner/control.sock") == {
        "RUNNER_JOB_ID": "j-1", "RUNNER_ATTEMPT": "3", "RUNNER_CHECKPOINT_DIR": "/scratch/ckpt",
        "RUNNER_CHECKPOINT_URL": "s3://b/j-1", "RUNNER_RESUME_STEP": "400",
        "RUNNER_CONTROL": "/run/runner/control.sock", "RUNNER_AGENT_LOSS_GRACE_SECONDS": "30.0",
        "RUNNER_NUM_NODES": "2", "RUNNER_NODE_RANK": "1", "RUNNER_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "RUNNER_MASTER_ADDR": "10.0.0.1", "RUNNER_MASTER_PORT": "29611", "RUNNER_GPUS_PER_NODE": "8",
        "RUNNER_CLOUD": "aws", "RUNNER_ZONE": "us-east-1a", "RUNNER_INSTANCE_TYPE": "p4d.24xlarge",
        "RUNNER_SPOT": "1", "RUNNER_CHECKPOINT_INTERVAL": "10m", "RUNNER_CHECKPOINT_KEEP": "2"}


def test_a_fresh_single_node_job_without_a_control_channel_gets_only_what_applies():
    """No resume step, no control socket (no agent-loss grace), no gang or placement, interval auto."""
    assignment = {"job_id": "j", "attempt": 1,
                  "checkpoint": {"durable_url": "file:///d", "local_dir": None, "interval": "auto", "resume": None}}
    assert env.job_environment(assignment, "/c", None) == {
        "RUNNER_JOB_ID": "j", "RUNNER_ATTEMPT": "1", "RUNNER_CHECKPOINT_DIR": "/c",
        "RUNNER_CHECKPOINT_URL": "file:///d", "RUNNER_CHECKPOINT_KEEP": "3"}


def test_names_are_the_stored_and_sent_strings():
    """str-valued: a value read back from the database or JSON compares equal; it prints and serializes plain."""
    assert JobState("RUNNING") is JobState.RUNNING and "RUNNING" == JobState.RUNNING
    assert f"{NodeState.DRAINING}" == str(NodeState.DRAINING) == "draining"
    assert json.dumps({"action": Action.MOVE_TO_SPOT, "reason": EndReason.STOPPED_BY_PEER}) == \
        '{"action": "move", "reason": "stopped-by-peer"}'


def test_the_state_predicates_agree_with_the_scheduler():
    assert {s for s in JobState if s.is_terminal} == states.TERMINAL == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert {s for s in JobState if s.is_active} == states.ACTIVE == {"PROVISIONING", "RUNNING"}
    assert all(not states.ALLOWED[s] for s in states.TERMINAL)
    assert set(states.ALLOWED) == set(JobState)
    assert {s for s in NodeState if s.is_up} == {"launching", "running"}
    assert {s for s in NodeState if s.is_released} == {"terminating", "terminated"}


def test_end_reasons():
    assert states.END_REASONS == ATTEMPT_END_REASONS | {"running"}
    assert EndReason.STOPPED_BY_PEER.reported_by_agent and not EndReason.STOPPED_BY_PEER.ends_attempt
    assert EndReason.LOST.ends_attempt and not EndReason.LOST.reported_by_agent
    assert set(AGENT_EXIT_REASONS) == {"succeeded", "failed", "preempted", "cancelled", "drill", "stopped-by-peer",
                                       "moved"}


def test_the_actions_that_stop_the_job():
    assert JOB_STOPPING_ACTIONS == {"cancel", "shutdown", "move"}
    assert Action.CANCEL.stops_job and not Action.STOP_FOR_PEER.stops_job and not Action.CONTINUE.stops_job
