"""A gang's node that vanishes after it reported ``succeeded`` for the running attempt ends nothing.

Through the real app on the in-memory provider: node 1 of a 2-node gang gets a notice and trains through it, its
ranks reach the job's last step and it reports ``succeeded``, then the cloud reclaims it while node 0's ranks still
tear down. The attempt goes on and succeeds with node 0's report; meanwhile node 0 hears that every other node has
reported (its launcher need not wait at its exit for node 1's). A node gone before any report still ends the
attempt as preempted: the controller cannot know its part was done.
"""

from __future__ import annotations

import time


from runner.scheduler.attempts import end_attempt
from runner.state.gangs import GangStore

from api_world import api, world  # noqa: F401 - pytest fixtures


def running_gang(world, api, num_nodes: int = 2) -> tuple[str, list[str], dict[int, dict]]:
    """A running gang whose last node trains through a notice; its node ids and each rank's node headers."""
    job_id = world.submit(resources={"num_nodes": num_nodes}, recovery={"resume_drill": "off", "max_preemptions": 3})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in range(num_nodes):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank])
    assert world.store.job(job_id).state == "RUNNING"
    notice = {"source": "aws", "action": "terminate", "deadline_unix": time.time() + 120, "prepare": True}
    assert api.post("/v1/agent/events", json={"kind": "notice", "data": notice},
                    headers=headers[num_nodes - 1]).json()["accepted"] is True
    return job_id, [r.node_id for r in ranks], headers


def beat(api, headers) -> dict:
    return api.post("/v1/agent/heartbeat", json={"phase": "running"}, headers=headers).json()


def exit_report(api, headers, reason: str, code: int = 0) -> dict:
    return api.post("/v1/agent/exit", json={"reason": reason, "exit_code": code}, headers=headers).json()


def test_a_node_reclaimed_after_its_part_succeeded_ends_nothing_and_the_job_succeeds_with_one_attempt(world, api):
    job_id, (node0, node1), headers = running_gang(world, api)
    world.tick()  # the replacement is launched
    # node 1 has not reported: node 0 trains on (beating sooner while a peer is on notice)
    assert beat(api, headers[0]) == {"action": "continue", "beat_seconds": 0.5}
    assert exit_report(api, headers[1], "succeeded")["action"] == "stay"  # its ranks finished during the notice
    assert beat(api, headers[0]) == {"action": "peers-exited"}  # no launcher of another node is left to wait for

    world.provider.preempt(node1)  # the deadline: the cloud reclaims it while node 0's ranks still tear down
    world.tick(2)
    current = world.store.current_attempt(job_id)
    assert current is not None and current.attempt == 1 and world.store.job(job_id).state == "RUNNING"
    assert world.store.node(node1).state in ("terminating", "terminated")  # it is released all the same
    assert any("after it reported succeeded" in message for message in world.events(job_id, "gang"))

    exit_report(api, headers[0], "succeeded")
    job = world.store.job(job_id)
    assert (job.state, job.preemptions) == ("SUCCEEDED", 0)
    (only,) = world.store.attempts(job_id)
    assert only.end_reason == "succeeded" and [n.end_reason for n in only.nodes] == ["succeeded", "succeeded"]
    world.tick(2)
    assert len(world.store.attempts(job_id)) == 1  # nothing is relaunched
    assert world.store.node(node0).state in ("terminating", "terminated")


def test_a_node_gone_before_it_reported_ends_the_attempt_as_preempted(world, api):
    """Nothing says its part was done (the reclaim came first, or its ranks were still training): a loss."""
    job_id, (_, node1), _ = running_gang(world, api)
    world.provider.preempt(node1)
    world.tick()
    (first, *_) = world.store.attempts(job_id)
    assert first.end_reason == "preempted" and world.store.job(job_id).preemptions == 1
    assert [n.end_reason for n in first.nodes] == ["kept", "preempted"]


def test_a_succeeded_report_that_lands_while_the_loss_is_decided_spares_the_attempt(world, api):
    """The node's report and the finding that it is gone race: the end is decided on what is recorded in its own
    transaction, so a report committed first always spares the attempt."""
    job_id, _, _ = running_gang(world, api)
    with world.store.db.transaction() as tx:  # recorded after the node watch read the node, before it ended
        GangStore(world.store).record_exit(tx, job_id, 1, 1, "succeeded", 0)
    assert end_attempt(world.store, job_id, 1, "preempted", ranks=(1,), message="gone", unless_finished=True) is None
    assert world.store.current_attempt(job_id).attempt == 1
    # Without it (any other end: a cancel, a rendezvous that never formed) the attempt ends as asked
    assert end_attempt(world.store, job_id, 1, "preempted", ranks=(1,), message="gone") == "RECOVERING"


def test_a_node_hears_that_its_peers_exited_only_once_every_other_node_has_reported(world, api):
    """Of three nodes, the one on notice reported: node 1's launcher may still reach node 0's exit barrier, so node 0
    is told only once node 1 has reported too; the node on notice is never told (its own notice ends its wait)."""
    _, _, headers = running_gang(world, api, num_nodes=3)
    assert exit_report(api, headers[2], "succeeded")["action"] == "stay"
    assert beat(api, headers[0])["action"] == "continue"
    assert exit_report(api, headers[1], "succeeded")["action"] == "stay"
    assert beat(api, headers[0]) == {"action": "peers-exited"}
    assert beat(api, headers[2])["action"] != "peers-exited"
