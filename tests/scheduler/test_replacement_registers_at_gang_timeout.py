"""An elastic gang's replacement registers just as the gang timeout passes: the registration and the reconciler's
giving it up are serialized, whichever is written first decides, and the replacement's restart-log row and its
node's fate agree with it (through the real app on the in-memory provider)."""

from __future__ import annotations

import threading

from api_world import api, world  # noqa: F401 - pytest fixtures
from races import run_together
from scheduler_world import ADMIN
from test_elastic_endpoints import elastic_gang, notice

from runner.scheduler import elastic
from runner.scheduler.reconciler import grow_elastic_gangs
from runner.state.elastic import ElasticStore

# How long the reconciler's pass, once it has read the attempt (the replacement not registered), waits for the
# registration to be written. With the replacement's row read again inside the pass's write, the registration is
# seen there; a pass holding the write lock while it waited would see the wait run out.
REGISTER_WAIT_S = 3.0


def launched_replacement(world, api) -> tuple[str, dict, dict]:
    """A 3-node elastic gang whose rank 1 had a notice (the world shrank) and whose replacement, rank 3, is launched
    and not registered: the job's id, the replacement's row and its node's headers."""
    job_id, first_nodes = elastic_gang(world, api)
    notice(api, first_nodes[1])
    world.tick()  # the replacement is launched
    row = next(r for r in world.store.current_attempt(job_id).nodes if r.rank == 3)
    assert row.registered_at is None and world.store.node(row.node_id).state == "running"
    world.ctx.gang_timeout = 0.0  # from now on it is past its gang timeout
    return job_id, row, {"Authorization": f"Bearer {world.ctx.node_token(row.node_id)}"}


def restart_log_node(api, job_id: str, rank: int) -> dict:
    (attempt,) = api.get(f"/v1/jobs/{job_id}/restarts", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    return next(n for n in attempt["nodes"] if n["rank"] == rank)


def test_a_registration_written_while_the_timeout_pass_decides_keeps_the_replacement(world, api, monkeypatch):
    """The reconciler's pass read the attempt (rank 3 not registered, past the timeout) and the registration was
    written before the pass's write: the agent got its assignment, so the replacement stays: its node runs, its row
    has not left, and its training's "joining" beat lets it in. (It was marked lost and its node released after its
    registration had been answered: the row said it left, the agent was told to stop.)"""
    job_id, row, headers = launched_replacement(world, api)
    read, registered = threading.Event(), threading.Event()
    worlds = ElasticStore.worlds

    def worlds_read(self, job_id_, attempt, tx=None):
        found = worlds(self, job_id_, attempt, tx)
        if threading.current_thread().name == "timeout_pass" and not read.is_set():
            read.set()
            registered.wait(REGISTER_WAIT_S)
        return found

    answers: list = []

    def register() -> None:
        try:
            read.wait(60)
            answers.append(api.post("/v1/agent/register", json={"address": "10.0.0.3"}, headers=headers))
        finally:
            registered.set()

    monkeypatch.setattr(ElasticStore, "worlds", worlds_read)
    run_together(timeout_pass=lambda: grow_elastic_gangs(world.ctx), register=register)
    monkeypatch.undo()
    assert read.is_set()
    (answer,) = answers
    assert answer.status_code == 200, answer.text  # registered first: its agent has its assignment
    assert answer.json()["gang"]["elastic_join"] is True
    assert world.store.node(row.node_id).state == "running"
    node = restart_log_node(api, job_id, 3)
    assert node["left_at"] is None and node["end_reason"] == "running"
    assert not any("did not register" in m for m in world.events(job_id, elastic.ELASTIC_EVENT))
    assert elastic.heartbeat_world(world.store, {"id": row.node_id, "job_id": job_id, "attempt": 1}, 0) is None


def test_a_registration_after_the_replacement_was_given_up_is_refused(world, api):
    """The pass wrote first: the replacement left the attempt (``lost``), its node goes, and its registration that
    comes a moment later is refused (its agent shuts down); another replacement is launched."""
    job_id, row, headers = launched_replacement(world, api)
    grow_elastic_gangs(world.ctx)
    answer = api.post("/v1/agent/register", json={"address": "10.0.0.3"}, headers=headers)
    assert answer.status_code == 409, answer.text
    assert world.store.node(row.node_id).state in ("terminating", "terminated")
    node = restart_log_node(api, job_id, 3)
    assert node["left_at"] and node["end_reason"] == "lost"
    assert sum("did not register" in m for m in world.events(job_id, elastic.ELASTIC_EVENT)) == 1
    world.ctx.gang_timeout = 600.0
    world.tick()
    assert any(r.rank == 4 and r.left_at is None for r in world.store.current_attempt(job_id).nodes)
