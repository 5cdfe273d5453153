"""A single node's agent registers while its attempt ends (the provider says its node is gone): the job never walks
back to RUNNING for the attempt that ended; it waits for its next attempt."""

from __future__ import annotations

import threading

from api_world import api, world  # noqa: F401 - pytest fixtures
from races import run_together

from runner.scheduler.attempts import end_attempt
from runner.state import Store

# How long the registration, once it has read its attempt, waits for the attempt's end. With the attempt read
# inside the registration's write, the end cannot come between the two, and the wait runs out.
END_WAIT_S = 3.0


def test_a_registration_racing_the_end_of_its_attempt_leaves_the_job_waiting_for_the_next(world, api, monkeypatch):
    """The registration read attempt 1 (running) and the attempt ended before its write: the job is RECOVERING
    with no attempt running, and the agent is told its attempt ended unless it registered before the end. (It was
    walked back to RUNNING, with no attempt running: the reconciler plans no attempt for a RUNNING job.)"""
    job_id = world.submit()
    world.tick()
    node = world.node(job_id)
    assert node.state == "running" and world.store.job(job_id).state == "PROVISIONING"
    read, ended = threading.Event(), threading.Event()
    reads = Store.current_attempt

    def current_attempt(self, job_id_, tx=None):
        found = reads(self, job_id_, tx)
        if not read.is_set() and threading.current_thread().name != "node_gone":
            read.set()
            ended.wait(END_WAIT_S)
        return found

    answers: list = []

    def register() -> None:
        answers.append(api.post("/v1/agent/register", json={}, headers={"Authorization": f"Bearer token-{node.id}"}))

    def node_gone() -> None:
        try:
            read.wait(60)
            end_attempt(world.store, job_id, 1, "preempted", message=f"node {node.id} is gone")
        finally:
            ended.set()

    monkeypatch.setattr(Store, "current_attempt", current_attempt)
    run_together(register=register, node_gone=node_gone)
    monkeypatch.undo()
    assert world.store.job(job_id).state == "RECOVERING"
    assert world.store.current_attempt(job_id) is None
    (answer,) = answers
    if answer.status_code == 200:  # registered before the end: the attempt ran, then ended
        assert world.store.attempts(job_id)[0].running_at is not None
    else:
        assert answer.status_code == 409, answer.text
