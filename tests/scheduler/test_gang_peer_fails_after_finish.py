"""A gang's node whose part of the attempt was done is never blamed for what another node does afterwards.

Through the real app on the in-memory provider, a 2-node gang: one node finishes its part (node 0 on notice reports
``ranks_finished``, its launcher still hosting the store; another node reports its exit ``succeeded``), maybe is
reclaimed after that, and then the other node fails or is lost. The other node's failure is a failure of the job on
that node: the attempt ends ``failed``, counted as a failure (not a preemption), with that node's exit code and its
rank in the message. The other node's loss is that node's loss. The node that finished is ``released`` in the
restart log's ``nodes`` (its node goes: it is on notice or gone) or ``kept`` (alive, with no notice), never
``preempted``; the job is relaunched only where its recovery allows the failure.
"""

from __future__ import annotations

import time

import pytest

from api_world import api, world  # noqa: F401 - pytest fixtures


def gang(world, api, noticed: int | None, max_failures: int = 0) -> tuple[str, list[str], dict[int, dict]]:
    """A running 2-node gang, the node of rank ``noticed`` on a notice it trains through (None: no notice)."""
    job_id = world.submit(resources={"num_nodes": 2},
                          recovery={"resume_drill": "off", "max_preemptions": 3, "max_failures": max_failures})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in range(2):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank])
    assert world.store.job(job_id).state == "RUNNING"
    if noticed is not None:
        notice = {"source": "aws", "action": "terminate", "deadline_unix": time.time() + 120, "prepare": True}
        assert api.post("/v1/agent/events", json={"kind": "notice", "data": notice},
                        headers=headers[noticed]).json()["accepted"] is True
        world.tick()  # the replacement for the node on notice is launched
    return job_id, [r.node_id for r in ranks], headers


def part_done(api, headers, how: str) -> None:
    if how == "ranks finished":  # node 0 on notice, its launcher still hosting the others' store
        body = {"kind": "ranks_finished", "data": {"message": "its ranks finished"}}
        assert api.post("/v1/agent/events", json=body, headers=headers).json()["accepted"] is True
    else:
        exit_report(api, headers, "succeeded", 0)


def exit_report(api, headers, reason: str, code: int | None) -> dict:
    return api.post("/v1/agent/exit", json={"reason": reason, "exit_code": code}, headers=headers).json()


def reclaim(world, node_id: str, how: str = "preempt") -> None:
    getattr(world.provider, how)(node_id)
    world.tick()  # the node watch finds it gone: its part was done, so this ends nothing
    assert world.store.node(node_id).state in ("terminating", "terminated")


def first_attempt(world, job_id: str) -> tuple:
    job = world.store.job(job_id)
    first = world.store.attempts(job_id)[0]
    return (job.state, job.preemptions, job.failures, first.end_reason, first.exit_code,
            [n.end_reason for n in first.nodes])


@pytest.mark.parametrize("how", ["ranks finished", "exit report"])
@pytest.mark.parametrize("reclaimed", [True, False], ids=["reclaimed", "not-yet-reclaimed"])
def test_node_1_failing_after_node_0_finished_its_part_is_node_1s_failure(world, api, how, reclaimed):
    job_id, (node0, _), headers = gang(world, api, noticed=0)
    part_done(api, headers[0], how)
    if reclaimed:
        reclaim(world, node0)
    exit_report(api, headers[1], "failed", 1)
    assert first_attempt(world, job_id) == ("FAILED", 0, 1, "failed", 1, ["released", "failed"])
    first = world.store.attempts(job_id)[0]
    assert "the job failed on the node of rank 1 (exit code 1)" in first.message
    assert first.notice is not None and first.notice.node_rank == 0  # the notice happened, it explains nothing
    world.tick(2)
    assert len(world.store.attempts(job_id)) == 1  # nothing is relaunched


def test_a_failure_the_job_may_retry_keeps_the_failed_node_and_replaces_the_one_on_notice(world, api):
    """The failure is retried (recovery.max_failures): node 1 is kept; node 0, on notice, is released (it would be
    reclaimed during the next attempt; the replacement prepared for it takes its rank)."""
    job_id, (node0, node1), headers = gang(world, api, noticed=0, max_failures=1)
    part_done(api, headers[0], "ranks finished")
    exit_report(api, headers[1], "failed", 1)
    assert first_attempt(world, job_id) == ("RECOVERING", 0, 1, "failed", 1, ["released", "kept"])
    world.tick()
    assert world.store.node(node0).state == "terminated" and world.store.node(node1).state == "running"


@pytest.mark.parametrize("reclaimed", [True, False], ids=["reclaimed", "not-yet-reclaimed"])
def test_node_0_failing_after_node_1_finished_its_part_is_node_0s_failure(world, api, reclaimed):
    job_id, (_, node1), headers = gang(world, api, noticed=1)
    part_done(api, headers[1], "exit report")
    if reclaimed:
        reclaim(world, node1)
    exit_report(api, headers[0], "failed", 3)
    assert first_attempt(world, job_id) == ("FAILED", 0, 1, "failed", 3, ["failed", "released"])
    assert "the job failed on the node of rank 0 (exit code 3)" in world.store.attempts(job_id)[0].message


def test_a_node_that_finished_its_part_and_vanished_without_a_notice_does_not_explain_a_peers_failure(world, api):
    """No notice at all: node 1 exited 0, then vanished; node 0's job fails after that. Node 1's loss explains
    nothing (its part was done): the failure is node 0's."""
    job_id, (_, node1), headers = gang(world, api, noticed=None)
    part_done(api, headers[1], "exit report")
    reclaim(world, node1, "lose")
    exit_report(api, headers[0], "failed", 1)
    assert first_attempt(world, job_id) == ("FAILED", 0, 1, "failed", 1, ["failed", "released"])


@pytest.mark.parametrize("how", ["ranks finished", "exit report"])
@pytest.mark.parametrize("vanish", ["preempt", "lose"])
def test_the_other_nodes_loss_after_node_0_finished_is_that_nodes_loss(world, api, how, vanish):
    """Node 1 vanishes before it reported: the attempt ends with node 1's loss (``lost`` without a notice of its own,
    ``preempted`` where the cloud says so); node 0, on notice, is released, never blamed."""
    job_id, (node0, node1), headers = gang(world, api, noticed=0)
    part_done(api, headers[0], how)
    getattr(world.provider, vanish)(node1)
    world.tick()
    reason = "preempted" if vanish == "preempt" else "lost"
    state, preemptions, failures, end, _, nodes = first_attempt(world, job_id)
    assert (preemptions, failures, end, nodes) == (1, 0, reason, ["released", reason])
    assert state in ("RECOVERING", "PROVISIONING")
    assert world.store.node(node0).state in ("terminating", "terminated")
