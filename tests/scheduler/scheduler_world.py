"""A scheduler on a real database (the `db_url` fixture: SQLite or Postgres) and the in-memory provider: tests
submit jobs and drive ``tick()``.

Nodes never boot: ``register`` does what the register endpoint does for a node's agent, and the
provider's scripting (``refuse``, ``preempt``, ``lose``, ``hold_launches``) plays the cloud.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from runner.controller.auth import hash_token
from runner.providers.memory import MemoryProvider
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.scheduler.states import PROVISIONING, RUNNING
from runner.scheduler.transitions import transition
from runner.spec import validate_job
from runner.state import Store, open_database
from runner.state.rows import Node
from runner.spec.stored import stored_job


@dataclass
class World:
    store: Store
    provider: MemoryProvider
    ctx: SchedulerContext
    reconciler: Reconciler

    _ids = itertools.count(1)

    def submit(self, **spec) -> str:
        """A PENDING job, as POST /v1/jobs stores it; drills are off unless the spec says otherwise."""
        spec = {"name": "job", "run": "train", "recovery": {"resume_drill": "off"}, **spec}
        job_id = f"{spec['name']}-{next(self._ids)}"
        with self.store.db.transaction() as tx:
            self.store.insert_job(tx, job_id, spec["name"], stored_job(validate_job(spec), None), "PENDING", time.time())
        return job_id

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.reconciler.tick()

    def node(self, job_id: str) -> Node:
        """The job's newest node row."""
        return self.store.nodes(states=("launching", "running", "terminating", "terminated"), job_id=job_id)[-1]

    def register(self, job_id: str) -> None:
        """The node's agent registers, as POST /v1/agent/register records it: the job is RUNNING."""
        node, now = self.node(job_id), time.time()
        with self.store.db.transaction() as tx:
            self.store.update_node(tx, node.id, registered_at=now, last_heartbeat=now)
            self.store.mark_attempt_running(tx, job_id, node.attempt, now)
            if self.store.job(job_id, tx).state == PROVISIONING:
                transition(tx, job_id, RUNNING, now=now, message="running")

    def cancel(self, job_id: str, at: float | None = None) -> None:
        """The user cancels, as POST /v1/jobs/ID/cancel records it (``at``: when, to skip a grace)."""
        with self.store.db.transaction() as tx:
            self.store.request_cancel(tx, job_id, at or time.time())

    def events(self, job_id: str, kind: str) -> list[str]:
        return [e.message for e in self.store.events(job_id) if e.kind == kind]


def make_world(db_url: str, provider: MemoryProvider | None = None, **settings) -> World:
    store = Store(open_database(db_url))
    provider = provider or MemoryProvider()
    ctx = SchedulerContext(store=store, providers={provider.name: provider}, controller_url="http://controller",
                           node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}",
                           **settings)
    return World(store, provider, ctx, Reconciler(ctx))


ADMIN = "admin-token"  # the admin token of the controller app over a world (conftest.py's ``api``)


def agent_api_world(db_url: str, provider: MemoryProvider | None = None, **settings) -> World:
    """``make_world`` whose node tokens the real agent API accepts (it hashes them as the controller does)."""
    world = make_world(db_url, provider, **settings)
    world.ctx.token_hasher = hash_token
    return world
