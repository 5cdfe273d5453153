"""The agent's heartbeat, the request every node sends once a second (answered by the front door,
runner/controller/front_door.py, in front of the web framework).

Per beat: one read of the database (``Store.heartbeat_views``: the node, its job and whether its attempt is
the running one, fresh on every beat, so another controller's cancel or release is heard on the next one),
the beat kept in memory for the once-a-second write (runner/controller/heartbeats.py). The rare answers (a
gang node kept after its attempt, a move to spot) take the slower reads they always took.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import HTTPException

from ..costpolicy import observe
from ..scheduler import elastic, gang_prestart, standby
from ..scheduler.spot_return import move_request
from ..scheduler.states import TERMINAL
from ..spec.stored import StoredJob
from ..state.standbys import PREPARED
from ..state.store import NODE_DRAINING, NODE_LAUNCHING, NODE_RUNNING
from ..protocol.actions import Action
from . import agent_api, gang_agent, reports
from .auth import heartbeat_caller
from .front_door import AWAITED, LeanRoute, json_object

HEARTBEAT_PATH = "/v1/agent/heartbeat"
GANG_NOTICE_BEAT_SECONDS = 0.5  # a gang node's beat while a peer is on notice (the reply's ``beat_seconds``)


async def heartbeat(state, authorization: str, body: bytes) -> dict:
    """Record liveness and progress; the answer tells the agent to continue, cancel, move (stop the job with a
    checkpoint for a move to spot: runner/scheduler/spot_return.py), or shut down (or, a gang node whose
    attempt ended while its job still runs, to stop that job and stay). The token is checked before the body."""
    node = await heartbeat_caller(authorization, state)
    phase, progress, generation = _beat(body)
    state.heartbeats.record(node["id"], time.time(), {"phase": phase, **(progress or {})})
    action = _action_from_view(node)
    if action == Action.STANDBY_WAIT and _spec_flags(node["spec"])[0]:  # a gang's replacement starting ahead
        if await _off_the_loop(state, gang_prestart.abandoned, state.store, node["job_id"], node["prepared_for"]):
            return {"action": action, "prestart": {"abandoned": True}}
    if action == Action.CONTINUE and node["attempt_current"] and _is_elastic(node["spec"]):  # its world may have changed
        if (progress or {}).get("joining") and state.is_leader():  # a replacement's training waits: let it in now
            await _off_the_loop(state, elastic.admit_at_once, state.scheduler, node["job_id"], node["id"])
        told = await _off_the_loop(state, elastic.heartbeat_world, state.store, node, generation)
        if told is not None:
            return {"action": told[0], **({"world": told[1]} if told[1] is not None else {})}
    if action is None:  # a move to spot or a kept gang node: answered from further reads, off the loop if remote
        action = await _off_the_loop(state, _action_with_reads, state, node)
        if action == Action.CONTINUE and (not node["attempt_current"] or node["attempt_on_notice"]) \
                and _spec_flags(node["spec"])[0] and not _is_elastic(node["spec"]):
            # A gang node trained through a peer's notice, or kept after it, may be told to start the next attempt
            # ahead (runner/scheduler/gang_prestart.py)
            ahead = await _off_the_loop(state, agent_api.peer_prestart, state, node)
            if ahead is not None:
                return {"action": action, "prestart": ahead}
            if node["attempt_current"]:
                # The word to start ahead comes on a reply, as soon as the replacement has started its own: every
                # second a beat waits then is a second of the handover's pause once the deadline's stop comes
                return {"action": action, "beat_seconds": GANG_NOTICE_BEAT_SECONDS}
    return {"action": action}


ROUTE = LeanRoute(heartbeat, max_body=64 * 1024, runs=AWAITED)  # a beat is a few hundred bytes


def _beat(body: bytes) -> tuple[str, dict | None, int]:
    """The body's ``phase`` (default running), ``progress`` and ``generation`` (an elastic gang's newest world its
    agent knows; default 0), refused (422) naming the field as FastAPI would."""
    beat = json_object(body)
    phase, progress, generation = beat.get("phase", "running"), beat.get("progress"), beat.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise HTTPException(422, "body.generation: Input should be a valid integer")
    if not isinstance(phase, str):
        raise HTTPException(422, "body.phase: Input should be a valid string")
    if progress is not None and not isinstance(progress, dict):
        raise HTTPException(422, "body.progress: Input should be a valid dictionary")
    return phase, reports.progress(progress), generation


def _action_from_view(node: dict) -> str | None:
    """The answer the view alone decides (nearly every beat), or None where further reads are needed."""
    if node["state"] == NODE_DRAINING:  # handed over: its process is exiting; the exit report releases it
        return Action.CONTINUE
    if node["attempt"] == PREPARED and node["prepared_for"] is not None:  # a replacement waiting to take over
        live = node["job_state"] not in TERMINAL and node["state"] in (NODE_RUNNING, NODE_LAUNCHING)
        return Action.STANDBY_WAIT if live else Action.SHUTDOWN
    current = node["attempt_current"]
    is_gang, has_deadline = _spec_flags(node["spec"])
    kept = not current and is_gang and node["job_state"] not in TERMINAL
    # A node still ``launching`` whose agent beats is up: its launch's answer has not been applied yet (the
    # launch was asked for again by the next leader after a failover, or the tick is late). Told to shut down,
    # its agent would stop the job and report it cancelled.
    if (not current and not kept) or node["state"] not in (NODE_RUNNING, NODE_LAUNCHING):
        return Action.SHUTDOWN
    if node["cancel_requested"]:
        return Action.CANCEL
    on_notice = node["attempt_on_notice"] and not _is_elastic(node["spec"])  # (an elastic gang's world decides)
    if kept or (not node["attempt_spot"] and has_deadline) or on_notice:
        return None
    return Action.CONTINUE


def _action_with_reads(state, node: dict) -> str:
    """A kept gang node's answer, whether a node on notice (a single node, or a gang's that is not elastic) trains
    on while its replacement gets ready (runner/scheduler/standby.py), or whether an on-demand attempt with a
    deadline should move to spot."""
    if node["attempt_current"] and node["attempt_on_notice"] and not _is_elastic(node["spec"]):
        return standby.old_node_action(state.store, node)
    if node["attempt_current"]:
        return Action.MOVE_TO_SPOT if move_request(state.store, node["job_id"], node["attempt"]) is not None else Action.CONTINUE
    return gang_agent.heartbeat_action(state, node)


async def _off_the_loop(state, function, *args):
    if state.store.db.shared:
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)
    return function(*args)


def _is_elastic(spec) -> bool:
    """Whether a job's gang is elastic (``resources.min_nodes`` below ``num_nodes``)."""
    min_nodes = getattr(spec.resources, "min_nodes", None)
    return min_nodes is not None and min_nodes < spec.resources.num_nodes


def _spec_flags(spec: StoredJob) -> tuple[bool, bool]:
    """Whether a job is a gang and whether the cost policy may move it."""
    return spec.resources.num_nodes > 1, observe.has_deadline(spec)
