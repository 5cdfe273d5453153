"""A replacement whose job fails while its node stays up (its training process crashed in or right after
``restore()`` as it joined an elastic gang): through the real app on the in-memory provider, its agent's exit
report. The survivors' collectives with it failed; they must get a world without it, not lose the attempt. The
replacement's node goes, another is launched, and the failure counts against ``recovery.max_failures``."""

from __future__ import annotations

import time

from api_world import api, world  # noqa: F401 - pytest fixtures
from scheduler_world import ADMIN
from test_elastic_endpoints import beat, elastic_gang, notice

from runner.state.elastic import ElasticStore


def joined_replacement(world, api, job_id: str, headers: dict[int, dict]) -> dict:
    """Rank 1's notice shrinks the world to ranks 0 and 2 (generation 1), the survivors move, and replacement rank
    3 registers, runs setup and is let in (generation 2): its node's headers."""
    notice(api, headers[1])
    world.tick()  # the replacement is launched
    replacement = next(r for r in world.store.current_attempt(job_id).nodes if r.rank == 3)
    mine = {"Authorization": f"Bearer {world.ctx.node_token(replacement.node_id)}"}
    api.post("/v1/agent/register", json={"address": "10.0.0.3"}, headers=mine)
    with world.store.db.transaction() as tx:
        world.store.record_setup(tx, replacement.node_id, time.time(), time.time())
    moved = {"generation": 1, "step": 140, "world_size": 2, "previous_world_size": 3}
    assert api.post("/v1/agent/world", json=moved, headers=headers[0]).json() == {"accepted": True}
    told = api.post("/v1/agent/heartbeat", json={"phase": "running", "generation": 0, "progress": {"joining": True}},
                    headers=mine).json()
    assert told["action"] == "world" and told["world"]["nnodes"] == 3
    mine["node_id"] = replacement.node_id
    return mine


def test_a_replacement_whose_job_fails_after_it_joined_leaves_the_world_and_the_survivors_train_on(world, api):
    job_id, headers = elastic_gang(world, api)
    joiner = joined_replacement(world, api, job_id, headers)
    node_id = joiner.pop("node_id")
    answer = api.post("/v1/agent/exit", json={"reason": "failed", "exit_code": 1}, headers=joiner).json()

    assert answer["action"] == "shutdown"  # its node goes
    assert world.store.node(node_id).state in ("terminating", "terminated")
    job, current = world.store.job(job_id), world.store.current_attempt(job_id)
    assert job.state == "RUNNING" and current.attempt == 1  # the attempt goes on
    assert job.failures == 1 and job.preemptions == 1  # the joiner's failure counts as one; rank 1's notice as the other
    worlds = ElasticStore(world.store).worlds(job_id, 1)
    assert [w.ranks for w in worlds] == [(0, 2), (0, 2, 3), (0, 2)]
    told = beat(api, headers[2], generation=2)  # a survivor hears the world without it
    assert told["action"] == "world" and (told["world"]["generation"], told["world"]["nnodes"]) == (3, 2)
    (row,) = api.get(f"/v1/jobs/{job_id}/restarts", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    node = next(n for n in row["nodes"] if n["rank"] == 3)
    assert node["end_reason"] == "failed" and node["left_at"]
    events = [e["message"] for e in api.get(f"/v1/jobs/{job_id}/events",
                                             headers={"Authorization": f"Bearer {ADMIN}"}).json()]
    assert any(f"replacement {node_id} (rank 3): its job failed (exit code 1)" in m and "trains on with 2 of 3" in m
               for m in events), events
    world.tick()
    replacement = next((r for r in world.store.current_attempt(job_id).nodes if r.rank == 4), None)
    assert replacement is not None and replacement.joined_at is not None  # another replacement is launched


def test_a_replacement_whose_job_fails_with_no_failures_left_ends_the_attempt_failed(world, api):
    """With ``recovery.max_failures`` used up the gang does not shrink again: the attempt ends failed, as when any
    node's job fails, and the job with it."""
    job_id = world.submit(resources={"num_nodes": 3, "min_nodes": 2}, recovery={"max_failures": 0, "resume_drill": "off"})
    world.tick()
    ranks = world.store.current_attempt(job_id).nodes
    headers = {r.rank: {"Authorization": f"Bearer {world.ctx.node_token(r.node_id)}"} for r in ranks}
    for rank in (0, 1, 2):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank}"}, headers=headers[rank])
    joiner = joined_replacement(world, api, job_id, headers)
    joiner.pop("node_id")
    api.post("/v1/agent/exit", json={"reason": "failed", "exit_code": 1}, headers=joiner)
    ended = world.store.attempts(job_id)[0]
    assert ended.end_reason == "failed"
    assert world.store.job(job_id).state == "FAILED"


def test_a_replacement_whose_job_fails_before_it_was_let_in_is_released_and_replaced(world, api):
    """Its job failed before its training said it waits for its world (in its setup's wake, or its script's start):
    the world is as it was; its node goes and another replacement is launched, not left registered with no job."""
    job_id, headers = elastic_gang(world, api)
    notice(api, headers[1])
    world.tick()
    replacement = next(r for r in world.store.current_attempt(job_id).nodes if r.rank == 3)
    mine = {"Authorization": f"Bearer {world.ctx.node_token(replacement.node_id)}"}
    api.post("/v1/agent/register", json={"address": "10.0.0.3"}, headers=mine)
    answer = api.post("/v1/agent/exit", json={"reason": "failed", "exit_code": 1}, headers=mine).json()

    assert answer["action"] == "shutdown"
    assert world.store.node(replacement.node_id).state in ("terminating", "terminated")
    assert [w.ranks for w in ElasticStore(world.store).worlds(job_id, 1)] == [(0, 2)]
    assert world.store.job(job_id).failures == 1 and world.store.job(job_id).state == "RUNNING"
    world.tick()
    assert any(r.rank == 4 for r in world.store.current_attempt(job_id).nodes)
