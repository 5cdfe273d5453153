"""An elastic gang through the real app on the in-memory provider: the heartbeat's ``world`` action (repeated until
the agent says it knows the generation), a notice that shrinks the world, a notice that cannot (the node is told to
checkpoint and stop), the exit report of a node that left, and ``POST /v1/agent/world`` with its token checks."""

from __future__ import annotations

import time


from api_world import api, world  # noqa: F401 - pytest fixtures
from scheduler_world import ADMIN


def elastic_gang(world, api, min_nodes=2) -> tuple[str, dict[int, dict]]:
    """A running 3-node elastic gang whose agents have registered; each rank's node headers."""
    job_id = world.submit(resources={"num_nodes": 3, "min_nodes": min_nodes})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in (0, 1, 2):  # the last registration completes the gang
        answer = api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank]).json()
    assert answer["gang"]["elastic"] is True and answer["gang"]["min_nodes"] == min_nodes
    assert world.store.job(job_id).state == "RUNNING"
    return job_id, headers


def beat(api, headers, generation=0):
    return api.post("/v1/agent/heartbeat", json={"phase": "running", "generation": generation},
                    headers=headers).json()


def notice(api, headers):
    body = {"kind": "notice", "data": {"source": "aws", "action": "terminate", "deadline": None, "prepare": True}}
    assert api.post("/v1/agent/events", json=body, headers=headers).json()["accepted"] is True


def test_a_notice_shrinks_the_world_and_each_survivor_hears_it_until_it_knows_it(world, api):
    job_id, headers = elastic_gang(world, api)
    assert beat(api, headers[0]) == {"action": "continue"}
    notice(api, headers[1])
    told = beat(api, headers[2])
    assert told["action"] == "world"
    assert {k: told["world"][k] for k in ("generation", "node_rank", "nnodes", "master_addr")} == {
        "generation": 1, "node_rank": 1, "nnodes": 2, "master_addr": "10.0.0.0"}
    assert beat(api, headers[2]) == told  # repeated: the agent has not said it knows generation 1
    assert beat(api, headers[2], generation=1) == {"action": "continue"}
    assert beat(api, headers[1]) == {"action": "continue"}  # on notice and out of the world: it trains on, untold
    # Its job then stops (it has no new world); its exit report ends nothing, and its node goes
    answer = api.post("/v1/agent/exit", json={"reason": "stopped-by-peer", "exit_code": 0}, headers=headers[1])
    assert answer.json()["action"] == "shutdown"
    current = world.store.current_attempt(job_id)
    assert current.attempt == 1 and world.store.job(job_id).state == "RUNNING"
    assert {r.rank: r.end_reason for r in current.nodes}[1] == "preempted"


def test_a_notice_that_would_leave_too_few_tells_the_node_to_checkpoint_and_stop(world, api):
    """min_nodes 3 of 3 is not elastic; with min_nodes 2, a second notice while shrunk is the case."""
    job_id, headers = elastic_gang(world, api)
    notice(api, headers[1])
    notice(api, headers[2])  # 1 of 3 would remain
    assert beat(api, headers[2], generation=1)["action"] == "checkpoint"
    assert world.store.current_attempt(job_id).attempt == 1  # its exit report ends the attempt, as for any gang


def test_every_restart_log_row_of_an_elastic_gang_has_world_sizes_before_its_training_reports_one(world, api):
    """A running elastic attempt whose training has not restored yet: `world_sizes` is there, empty, in
    `runner restarts` and in `runner status`'s current attempt; a gang that is not elastic has none."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    job_id, _ = elastic_gang(world, api)
    (row,) = api.get(f"/v1/jobs/{job_id}/restarts", headers=admin).json()
    assert row["world_sizes"] == [] and row["end_reason"] == "running"
    assert api.get(f"/v1/jobs/{job_id}", headers=admin).json()["current_attempt"]["world_sizes"] == []
    rigid = world.submit(resources={"num_nodes": 3})
    world.tick()
    assert all("world_sizes" not in r for r in api.get(f"/v1/jobs/{rigid}/restarts", headers=admin).json())


def test_the_world_report_is_kept_for_the_callers_own_job_only(world, api):
    job_id, headers = elastic_gang(world, api)
    other_id, other_headers = elastic_gang(world, api)
    change = {"generation": 1, "step": 140, "world_size": 2, "previous_world_size": 3}
    assert api.post("/v1/agent/world", json=change).status_code == 401
    assert api.post("/v1/agent/world", json=change, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert api.post("/v1/agent/world", json=change, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 403
    assert api.post("/v1/agent/world", json={**change, "step": -1}, headers=headers[0]).status_code == 422
    assert api.post("/v1/agent/world", json=change, headers=headers[0]).json() == {"accepted": True}
    rows = api.get(f"/v1/jobs/{job_id}/restarts", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert rows[0]["world_sizes"] == [{"step": 0, "world_size": 3}, {"step": 140, "world_size": 2}]
    assert world.store.current_attempt(other_id).world_sizes is None  # the token names the job, not the body


def test_a_replacement_whose_training_waits_gets_its_world_in_the_answer_to_the_beat_that_says_so(world, api):
    """The beat saying ``joining`` lets the replacement in at once (its answer is the grown world), not at the
    reconciler's next pass after the beat is written; a beat without it lets nobody in."""
    job_id, headers = elastic_gang(world, api)
    notice(api, headers[1])
    world.tick()  # the replacement is launched
    replacement = next(r for r in world.store.current_attempt(job_id).nodes if r.rank == 3)
    mine = {"Authorization": f"Bearer {world.ctx.node_token(replacement.node_id)}"}
    answer = api.post("/v1/agent/register", json={"address": "10.0.0.3"}, headers=mine).json()
    assert answer["gang"]["elastic_join"] is True and answer["gang"]["job_num_nodes"] == 3
    with world.store.db.transaction() as tx:
        world.store.record_setup(tx, replacement.node_id, time.time(), time.time())
    assert beat(api, mine) == {"action": "continue"}  # its training has not said it waits
    joining = {"phase": "running", "generation": 0, "progress": {"joining": True}}
    assert api.post("/v1/agent/heartbeat", json=joining, headers=mine).json() == {"action": "continue"}  # (*)
    moved = {"generation": 1, "step": 140, "world_size": 2, "previous_world_size": 3}
    assert api.post("/v1/agent/world", json=moved, headers=headers[0]).json() == {"accepted": True}
    told = api.post("/v1/agent/heartbeat", json={"phase": "running", "generation": 0, "progress": {"joining": True}},
                    headers=mine).json()
    assert told["action"] == "world"
    assert (told["world"]["generation"], told["world"]["node_rank"], told["world"]["nnodes"]) == (2, 2, 3)
    assert beat(api, headers[0], generation=1)["world"]["generation"] == 2  # the survivors hear it on their next beat
    # (*) not before the survivors have moved to the shrunk world: one that had not heard of it would skip it


def test_preempting_the_rank_that_left_names_the_ranks_still_running(world, api):
    """After a shrink the rank that left has no node: `runner preempt --node 1` says which ranks run now (a
    replacement takes a rank of its own), rather than only that rank 1 has none."""
    job_id, headers = elastic_gang(world, api)
    notice(api, headers[1])
    beat(api, headers[0])
    api.post("/v1/agent/exit", json={"reason": "stopped-by-peer", "exit_code": 0}, headers=headers[1])
    answer = api.post(f"/v1/jobs/{job_id}/preempt", json={"node": 1, "notice": "aws"},
                      headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 409
    assert "no running node of rank 1" in answer.json()["detail"]
    assert "its running node ranks: 0, 2" in answer.json()["detail"]
