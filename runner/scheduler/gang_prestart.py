"""A gang's next attempt started ahead while the gang trains through a notice (agents/gang_prestart.py).

A gang whose node is on notice trains on while that node's replacement gets ready (gang_standby.py). Where it is
safe, the controller has every node of the next attempt start the job's process ahead too, so that the pause at
the handover holds no launcher's start, rendezvous, import or model building:

- :func:`plan`: when the replacement is launched, the next attempt's rendezvous port is chosen (not the running
  attempt's, which its launchers still hold) and kept in the standby record (``prestart``). A GPU gang's too: on a
  node with GPUs the processes started ahead hold before their first CUDA use rather than in ``restore()`` (the
  agents decide it, runner/checkpoint/cuda_gate.py), so a kept node's new ranks build nothing on the GPUs its old
  ranks still use; ``waiting`` then means held there. :func:`note_address`: when the replacement registers, it is kept only where the running attempt
  restores through runner.checkpoint (it has reported a restore), as for a single node.
- :func:`gang_for`: the next attempt's gang as a node's process started ahead sees it: every node's address (the
  replacement's in the rank it takes), the chosen port.
- :func:`record_report`: each node says ``started``, ``waiting`` (every local rank waits in ``restore()``, or
  on a GPU node before its first CUDA use) or ``failed``; the replacement starts first (after its setup), then the kept nodes are told to.
- :func:`holds_the_handover`: the node on notice trains on after the replacement is ready until every node
  waits, one failed, or :data:`WAIT_SECONDS` have passed (the notice's own deadline comes first, as always).
- :func:`defers_the_plan`: the gang stopped before every node's processes waited (the notice's deadline came
  first: on AWS the replacement's boot and setup take most of the 2 minutes). The replacement still starts ahead
  once its setup is done, and the kept nodes (their old processes gone) then too; the next attempt is planned
  once every node waits, one failed, or a bound has passed (:data:`SETUP_WAIT_SECONDS` after the replacement's
  launch while it sets up, :data:`PLAN_WAIT_SECONDS` after the first start ahead), so nothing nearly ready is
  thrown away: the kept nodes would wait for the replacement's setup all the same.
- :func:`port_for_next`: the next attempt keeps the chosen port only when every node waited and the plan runs
  the same nodes at the same ranks; otherwise another port, and the processes started ahead (their gang no
  longer the attempt's) are stopped and the job starts anew on every node, as it did without this.
- :func:`abandoned`: whether a node still starting ahead should give up now (a node failed, or the next attempt
  was planned without the chosen port), rather than wait for its bound.
"""

from __future__ import annotations

from ..providers.base import rendezvous_port
from ..state.gangs import GangStore
from ..state.rows import Attempt, Job, Node
from ..state.standbys import PREPARED, StandbyStore

KEY = "prestart"  # the standby record's
STARTED, WAITING, FAILED = "started", "waiting", "failed"
STATES = (STARTED, WAITING, FAILED)
WAIT_SECONDS = 60.0  # after the replacement is ready, at most, for the other nodes' ranks to wait in restore()
PLAN_WAIT_SECONDS = 180.0  # after the first node started ahead, at most, before the next attempt is planned anyway
SETUP_WAIT_SECONDS = 900.0  # after the replacement's launch, at most, for it to start ahead (its boot and setup)


def allowed(job: Job) -> bool:
    return job.num_nodes > 1 and not job.spec.resources.elastic


def plan(providers: dict, job: Job, current: Attempt) -> dict | None:
    """The standby record's ``prestart`` for a gang's replacement launched now (None where it is not allowed)."""
    if not allowed(job):
        return None
    return {"port": rendezvous_port(providers.get(current.cloud), current.master_port), "nodes": {}}


def of(store, job_id: str, attempt: int, tx=None) -> dict | None:
    return (StandbyStore(store).record(tx, job_id, attempt) or {}).get(KEY)


def note_address(store, node: Node, address: str | None, restores: bool) -> dict | None:
    """The replacement registered (``address``: where its peers reach it); its attempt's ``prestart``, dropped
    where the job is not known to ``restores`` through runner.checkpoint (nothing is then started ahead)."""
    standbys = StandbyStore(store)
    with store.db.transaction() as tx:
        prestart = of(store, node.job_id, node.prepared_for, tx)
        if prestart is None:
            return None
        if not restores or not address:
            standbys.update_record(tx, node.job_id, node.prepared_for, **{KEY: None})
            return None
        if prestart.get("address") != address:
            prestart = {**prestart, "address": address}
            standbys.update_record(tx, node.job_id, node.prepared_for, **{KEY: prestart})
    return prestart


def gang_for(store, job: Job, attempt: int, prestart: dict, rank: int, gpus_per_node: int) -> dict | None:
    """The gang of attempt ``attempt`` + 1 for the node of ``rank``, as its process started ahead is given it."""
    replacement = StandbyStore(store).live(job.id)
    if replacement is None or replacement.prepared_for != attempt or not prestart.get("address"):
        return None
    ranks = GangStore(store).nodes_of(job.id, attempt)
    ips = [prestart["address"] if r.rank == replacement.rank else r.address for r in ranks]
    if len(ips) != job.num_nodes or any(not ip for ip in ips):
        return None
    return {"num_nodes": job.num_nodes, "node_rank": rank, "node_ips": ips, "master_addr": ips[0],
            "master_port": prestart["port"], "gpus_per_node": gpus_per_node}


def peer_may_start(store, job_id: str, attempt: int, rank: int) -> dict | None:
    """The ``prestart`` of the attempt a kept node (of ``rank``) runs or ran last, when that node is to start ahead
    now: the replacement has started its own (its setup is done), this node has not said how far it got, and the
    next attempt is not planned yet."""
    prestart = of(store, job_id, attempt)
    if prestart is None or not _may_start(store, job_id, attempt, None):
        return None
    replacement = StandbyStore(store).live(job_id)
    if replacement is None or replacement.prepared_for != attempt or replacement.rank == rank:
        return None
    nodes = prestart.get("nodes") or {}
    if str(replacement.rank) not in nodes or str(rank) in nodes:
        return None
    return prestart


def record_report(store, node: Node, data: dict, now: float) -> bool:
    """A node's ``prestart`` report (its ``state`` for the attempt it names); False when it is for no prestart, or
    (``started``) the attempt it was to follow is no longer running on notice: that node stops its process."""
    state, attempt = data.get("state"), data.get("attempt")
    if state not in STATES or not isinstance(attempt, int):
        return False
    running = node.prepared_for if node.attempt == PREPARED else node.attempt
    if running is None or attempt != running + 1:
        return False
    standbys = StandbyStore(store)
    with store.db.transaction() as tx:
        prestart = of(store, node.job_id, running, tx)
        if prestart is None:
            return False
        if state == STARTED and not _may_start(store, node.job_id, running, tx):
            return False  # too late: the gang's next attempt is planned
        nodes = dict(prestart.get("nodes") or {})
        if nodes.get(str(node.rank)) == FAILED:
            return True  # a node that failed does not come back
        nodes[str(node.rank)] = state
        changed = {**prestart, "nodes": nodes}
        if state == STARTED and prestart.get("started_at") is None:
            changed["started_at"] = now
        standbys.update_record(tx, node.job_id, running, **{KEY: changed})
        if state != STARTED:
            store.add_event(tx, node.job_id, "standby",
                            f"node {node.id} (rank {node.rank}): the next attempt, started ahead, "
                            + (f"waits {data.get('message') or 'in restore()'}" if state == WAITING else
                               f"did not get ready ({data.get('message') or 'no reason given'})"), attempt=running)
    return True


def _may_start(store, job_id: str, running: int, tx) -> bool:
    """The attempt on notice still runs, or it has ended and the next one is not planned yet."""
    current = store.current_attempt(job_id, tx)
    if current is not None:
        return current.attempt == running and current.notice is not None
    return not any(a.attempt > running for a in store.attempts(job_id, tx))


def every_node_waits(prestart: dict | None, num_nodes: int) -> bool:
    nodes = (prestart or {}).get("nodes") or {}
    return all(nodes.get(str(rank)) == WAITING for rank in range(num_nodes))


def holds_the_handover(prestart: dict | None, num_nodes: int, ready_at: float, now: float) -> bool:
    """After the replacement is ready: whether the node on notice should still train on, waiting for the other
    nodes' processes started ahead."""
    nodes = (prestart or {}).get("nodes") or {}
    if prestart is None or prestart.get("started_at") is None or FAILED in nodes.values() \
            or every_node_waits(prestart, num_nodes):
        return False  # (ready without a start ahead: its process could not be started; nothing to wait for)
    return now < ready_at + WAIT_SECONDS


def defers_the_plan(record: dict | None, num_nodes: int, now: float) -> bool:
    """Whether the next attempt waits for processes started ahead on every node that are not all waiting yet
    (``record``: the ended attempt's standby record)."""
    prestart = (record or {}).get(KEY)
    if prestart is None or every_node_waits(prestart, num_nodes):
        return False
    nodes = prestart.get("nodes") or {}
    if FAILED in nodes.values():
        return False
    if prestart.get("started_at") is None:  # the replacement still boots or sets up: the gang waits for it anyway
        return record.get("ready_at") is None and now < (record.get("launched_at") or now) + SETUP_WAIT_SECONDS
    return now < prestart["started_at"] + PLAN_WAIT_SECONDS


def abandoned(store, job_id: str, prepared_for: int) -> bool:
    """Whether the processes started ahead for attempt ``prepared_for`` + 1 will not be adopted: a node failed, or
    that attempt exists on another port (or not at all: the job ended)."""
    prestart = of(store, job_id, prepared_for)
    if prestart is None:
        return True
    if FAILED in ((prestart.get("nodes") or {}).values()):
        return True
    following = next((a for a in store.attempts(job_id) if a.attempt == prepared_for + 1), None)
    return following is not None and following.master_port != prestart["port"]


def port_for_next(provider, store, job_id: str, previous: Attempt | None, keep: dict[int, str],
                  launch: bool, prepared: Node | None) -> int:
    """The rendezvous port of the gang's next attempt (``keep``: rank -> node id of the plan; ``launch``: it
    launches nodes). The one its processes started ahead wait on, where every node of the plan has them waiting;
    otherwise another than the previous attempt's and theirs."""
    previous_port = previous.master_port if previous else None
    prestart = of(store, job_id, previous.attempt) if previous else None
    if prestart is None:
        return rendezvous_port(provider, previous_port)
    if not launch and prepared is not None and every_node_waits(prestart, previous.num_nodes):
        before = {r.rank: r.node_id for r in GangStore(store).nodes_of(job_id, previous.attempt)}
        expected = {**before, prepared.rank: prepared.id}
        if keep == expected:
            return prestart["port"]
    for _ in range(20):
        port = rendezvous_port(provider, previous_port)
        if port != prestart["port"]:
            return port
    return port
