"""Node 0 of a gang, on notice, reports that its ranks finished while its launcher still hosts the others' store.

Through the real app on the in-memory provider: node 0 of a 2-node gang gets a notice and trains through it; its
ranks reach the job's last step and exit 0, while its launcher stays at its exit barrier (it hosts the store node 1's
launcher will wait on), so node 0 reports ``ranks_finished`` rather than its exit. That is node 0's success for the
running attempt: its reclaim from then on ends nothing, its launcher's exit reported later (killed at the reclaim,
say) does not turn it into a failure, and node 1 hears that it need not wait for node 0's launcher. A failure or a
loss of the other node decides the attempt as it does with node 0's exit report: as that node's, never node 0's.
"""

from __future__ import annotations

import time

import pytest

from api_world import api, world  # noqa: F401 - pytest fixtures


def running_gang(world, api, max_failures: int = 0) -> tuple[str, list[str], dict[int, dict]]:
    """A running 2-node gang whose node 0 trains through a notice; its node ids and each rank's node headers."""
    job_id = world.submit(resources={"num_nodes": 2},
                          recovery={"resume_drill": "off", "max_preemptions": 3, "max_failures": max_failures})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in range(2):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank])
    assert world.store.job(job_id).state == "RUNNING"
    notice = {"source": "aws", "action": "terminate", "deadline_unix": time.time() + 120, "prepare": True}
    assert api.post("/v1/agent/events", json={"kind": "notice", "data": notice},
                    headers=headers[0]).json()["accepted"] is True
    return job_id, [r.node_id for r in ranks], headers


def ranks_finished(api, headers) -> dict:
    return api.post("/v1/agent/events", json={"kind": "ranks_finished", "data": {"message": "its ranks finished"}},
                    headers=headers).json()


def beat(api, headers) -> dict:
    return api.post("/v1/agent/heartbeat", json={"phase": "running"}, headers=headers).json()


def exit_report(api, headers, reason: str, code: int | None = 0) -> dict:
    return api.post("/v1/agent/exit", json={"reason": reason, "exit_code": code}, headers=headers).json()


def test_node_0_reclaimed_after_its_ranks_finished_ends_nothing_and_the_job_succeeds_with_one_attempt(world, api):
    job_id, (node0, node1), headers = running_gang(world, api)
    world.tick()  # the replacement is launched
    assert beat(api, headers[1])["action"] == "continue"  # node 0 has said nothing: node 1 trains on
    assert ranks_finished(api, headers[0]) == {"accepted": True, "state": None}  # node 1 has not reported
    assert beat(api, headers[1]) == {"action": "peers-exited"}  # its launcher need not wait for node 0's after all
    assert any("its part of attempt 1 is done" in m for m in world.events(job_id, "gang"))

    world.provider.preempt(node0)  # the reclaim, while node 0's launcher still hosts the store
    world.tick(2)
    current = world.store.current_attempt(job_id)
    assert current is not None and current.attempt == 1 and world.store.job(job_id).state == "RUNNING"
    assert world.store.node(node0).state in ("terminating", "terminated")  # released all the same
    assert any("after it reported succeeded" in m for m in world.events(job_id, "gang"))

    exit_report(api, headers[1], "succeeded")
    job = world.store.job(job_id)
    assert (job.state, job.preemptions) == ("SUCCEEDED", 0)
    (only,) = world.store.attempts(job_id)
    assert only.end_reason == "succeeded" and [n.end_reason for n in only.nodes] == ["succeeded", "succeeded"]
    assert only.exit_code == 0
    world.tick(2)
    assert len(world.store.attempts(job_id)) == 1  # nothing is relaunched
    assert world.store.node(node1).state in ("terminating", "terminated")


def test_the_launchers_exit_reported_after_the_ranks_finished_does_not_turn_the_success_into_a_failure(world, api):
    """The launcher, killed (SIGKILL at the reclaim, a stop at the deadline's margin), exits nonzero after node 0's
    part was done: node 0's report stands."""
    job_id, _, headers = running_gang(world, api)
    ranks_finished(api, headers[0])
    exit_report(api, headers[0], "failed", -9)
    assert world.store.job(job_id).state == "RUNNING" and world.store.current_attempt(job_id).attempt == 1
    exit_report(api, headers[1], "succeeded")
    job = world.store.job(job_id)
    (only,) = world.store.attempts(job_id)
    assert (job.state, only.end_reason, only.exit_code) == ("SUCCEEDED", "succeeded", 0)


def node_0_says_its_part_is_done(api, headers, how: str) -> None:
    if how == "ranks finished":
        assert ranks_finished(api, headers)["accepted"] is True
    else:  # its exit report, as before: its launcher had exited
        exit_report(api, headers, "succeeded")


def ending(world, job_id: str) -> tuple:
    job = world.store.job(job_id)
    first = world.store.attempts(job_id)[0]
    return (job.state, job.preemptions, job.failures, first.end_reason, [n.end_reason for n in first.nodes],
            world.store.node(first.nodes[0].node_id).state)


@pytest.mark.parametrize("how", ["ranks finished", "exit report"])
def test_the_others_failure_after_node_0s_part_is_decided_as_with_node_0s_exit(world, api, how):
    """Node 0's ranks finished, then node 1's job fails: the attempt ends exactly as it does when node 0 reported its
    exit instead: node 1's failure (the notice explains nothing once node 0's part was done; node 0, on notice, is
    released, never blamed: tests/scheduler/test_gang_peer_fails_after_finish.py has the other orders)."""
    job_id, _, headers = running_gang(world, api)
    node_0_says_its_part_is_done(api, headers[0], how)
    exit_report(api, headers[1], "failed", 1)
    assert ending(world, job_id) == ("FAILED", 0, 1, "failed", ["released", "failed"], "terminating")


@pytest.mark.parametrize("how", ["ranks finished", "exit report"])
def test_the_others_loss_after_node_0s_part_is_decided_as_with_node_0s_exit(world, api, how):
    """Node 1 vanishes before it reported, after node 0's part was done: node 1's loss (the cloud says preempted);
    node 0, on notice, is released with the attempt (its launcher goes with it) and the replacement takes its rank."""
    job_id, (_, node1), headers = running_gang(world, api)
    node_0_says_its_part_is_done(api, headers[0], how)
    world.provider.preempt(node1)
    world.tick()  # (the next attempt is planned at once: the replacement of node 0 stands by)
    assert ending(world, job_id) == ("PROVISIONING", 1, 0, "preempted", ["released", "preempted"], "terminated")


def test_node_0_gone_before_its_report_still_ends_the_attempt_as_preempted(world, api):
    """Its ranks never said they finished (still training, or the reclaim came first): a loss, as before."""
    job_id, (node0, _), _ = running_gang(world, api)
    world.provider.preempt(node0)
    world.tick()
    (first, *_) = world.store.attempts(job_id)
    assert first.end_reason == "preempted" and world.store.job(job_id).preemptions == 1
    assert [n.end_reason for n in first.nodes] == ["preempted", "kept"]


def test_the_report_is_not_taken_after_the_nodes_exit_nor_for_a_single_node(world, api):
    job_id, _, headers = running_gang(world, api, max_failures=3)
    exit_report(api, headers[0], "succeeded")
    assert ranks_finished(api, headers[0]) == {"accepted": False}  # its exit came first: that report stands

    single = world.submit(recovery={"resume_drill": "off"})
    world.tick()
    node = world.store.current_attempt(single).node_id
    headers = {"Authorization": f"Bearer {world.ctx.node_token(node)}"}
    api.post("/v1/agent/register", json={"address": "10.0.0.9"}, headers=headers)
    assert ranks_finished(api, headers) == {"accepted": False}
    assert world.store.job(single).state == "RUNNING"


def test_every_node_of_a_gang_beats_sooner_while_a_peer_is_on_notice(world, api):
    """The word to start the gang's next attempt ahead reaches a kept node on a heartbeat's reply, as soon as the
    replacement has started its own: the reply asks for the next beat within half a second while a peer is on notice
    (a second the word waits is a second of the handover's pause), and not otherwise."""
    job_id = world.submit(resources={"num_nodes": 2}, recovery={"resume_drill": "off"})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in range(2):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank])
    assert beat(api, headers[1]) == {"action": "continue"}  # no notice: the agent's own interval
    notice = {"source": "aws", "action": "terminate", "deadline_unix": time.time() + 120, "prepare": True}
    api.post("/v1/agent/events", json={"kind": "notice", "data": notice}, headers=headers[0])
    world.tick()  # the replacement is launched
    assert beat(api, headers[1]) == {"action": "continue", "beat_seconds": 0.5}
