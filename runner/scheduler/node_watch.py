"""Watching running nodes through their provider's API: a node the cloud says is gone ends its attempt.

Describes are asked for here and answered later (:mod:`.cloud_calls`), so a describe that hangs on a
throttled API holds up no other node and no other worker. Each tick:

- :func:`request_describes` asks about every running or draining node that is due (``describe_interval``
  of its provider since the last describe; a node whose describe is still out is skipped). A node past its
  ``terminate_at`` (a drained node's deadline, the simulated spot market's reclaim) is terminated first.
  A provider whose describes are local or batched (``DescribesInBatch``) gets one call for all its nodes.
- :func:`apply_describes` applies what has come back: load the node, decide with :func:`gone_reason`,
  apply. An answer about a node that has moved on since it was asked (released, or on another attempt) is
  ignored, and a provider error is never a lost node: the node is described again later.
"""

from __future__ import annotations

import time
from functools import partial

import structlog

from ..providers.base import DescribesInBatch, NodeStatus, Provider
from ..providers.errors import ProviderError
from ..protocol.events import EventKind
from ..state.rows import Node
from ..state.store import NODE_DRAINING, NODE_RUNNING, NODE_TERMINATING
from .attempts import end_attempt
from .cloud_calls import Answer
from .gang_workers import gang_node_gone

log = structlog.get_logger(__name__)

WATCHED = (NODE_RUNNING, NODE_DRAINING)  # a draining node's attempt has ended already; its node is still ours


def describe_wakes(answer: Answer) -> bool:
    """Only a node found gone (or a bug) is work for the next tick; 'alive' and an API hiccup are not."""
    if answer.error is not None:
        return not isinstance(answer.error, ProviderError)
    return not answer.value.alive


def watch_running_nodes(ctx) -> None:
    """Ask about the nodes that are due, then apply what has come back (inline: this tick's own answers)."""
    request_describes(ctx)
    apply_describes(ctx)


# The running nodes are read a few times per shortest describe interval, not every tick: at 2,000 nodes the read
# and the loop over it cost ~20 ms of the interpreter a tick, which the API's event loop waits out. A node is
# then described at most a quarter of its interval late (a cloud's 10 s: every 10 to 12.5 s).
READS_PER_DESCRIBE_INTERVAL = 4


def request_describes(ctx) -> None:
    """Ask each provider about its nodes that are due a describe, without waiting for the answers."""
    now, clock = time.time(), time.monotonic()
    shortest = min((provider.describe_interval for provider in ctx.providers.values()), default=0.0)
    if clock - ctx.watched_at < shortest / READS_PER_DESCRIBE_INTERVAL:
        return
    ctx.watched_at = clock
    out = ctx.describes.keys_in_flight()
    batches: dict[str, dict[str, tuple[int, str | None]]] = {}
    for node in ctx.store.watched_nodes(WATCHED):  # a lean read: dicts of the few columns needed here
        node_id, ref, attempt, terminate_at = node["id"], node["provider_ref"], node["attempt"], node["terminate_at"]
        if node_id in out:
            continue
        provider = ctx.providers[node["provider"]]
        reclaim = terminate_at is not None and terminate_at <= now
        if provider.describe_interval > 0:  # (an interval of 0: every tick, nothing to remember)
            if not reclaim and clock - ctx.described_at.get(node_id, 0.0) < provider.describe_interval:
                continue
            ctx.described_at[node_id] = clock
        if reclaim:
            ctx.describes.request(node_id, partial(_reclaim, provider, node_id, ref), asked=attempt)
        elif isinstance(provider, DescribesInBatch):
            batches.setdefault(node["provider"], {})[node_id] = (attempt, ref)
        else:
            ctx.describes.request(node_id, partial(provider.describe, node_id, ref), asked=attempt)
    for name, nodes in batches.items():
        refs = {node_id: ref for node_id, (_, ref) in nodes.items()}
        ctx.describes.request_batch({node_id: attempt for node_id, (attempt, _) in nodes.items()},
                                    partial(_describe_many, ctx.providers[name], refs))


def _reclaim(provider: Provider, node_id: str, provider_ref: str | None) -> NodeStatus:
    provider.terminate(node_id, provider_ref)  # its deadline has passed (or the simulated market reclaims it)
    return provider.describe(node_id, provider_ref)


def _describe_many(provider: DescribesInBatch, refs: dict[str, str | None], node_ids: list[str]) -> dict[str, NodeStatus]:
    return provider.describe_many([(node_id, refs[node_id]) for node_id in node_ids])


def gone_reason(status: NodeStatus, asked_attempt: int, node: Node | None) -> str | None:
    """The end reason a describe answer calls for ("preempted" or "lost"), or None: the node is alive, or the
    answer is stale (the node has been released since, or holds another attempt than when it was asked)."""
    if node is None or node.state not in WATCHED or node.attempt != asked_attempt:
        return None
    if status.alive:
        return None
    return "preempted" if status.reason == "preempted" else "lost"


def apply_describes(ctx) -> None:
    """Every describe answer that has come back, each applied on its own (an unexpected error is raised last)."""
    unexpected = None
    for answer in ctx.describes.answers():
        if answer.error is not None:
            if not isinstance(answer.error, ProviderError):
                unexpected = unexpected or answer.error  # a bug: the node is described again next time
            else:
                log.warning("describe failed; will retry", node=answer.key, error=str(answer.error))
            continue
        if not answer.value.alive:
            node = ctx.store.node(answer.key)
            job_id = node.job_id if node is not None else answer.key
            ctx.guard.run("node gone", job_id, _node_gone, ctx, answer.key, answer.value, answer.asked)
    if unexpected is not None:
        raise unexpected


def _node_gone(ctx, node_id: str, status: NodeStatus, asked_attempt: int) -> None:
    store = ctx.store
    node = store.node(node_id)
    reason = gone_reason(status, asked_attempt, node)
    if reason is None:
        log.info("stale describe answer ignored", node=node_id, asked_attempt=asked_attempt,
                 state=node.state if node else None)
        return
    ctx.described_at.pop(node_id, None)
    why = unsaved_checkpoint_note(store, node)
    if store.job(node.job_id).num_nodes > 1:
        gang_node_gone(ctx, node, reason, f"node {node.id} (rank {node.rank}) is gone ({status.reason}){why}")
    else:
        end_attempt(store, node.job_id, node.attempt, reason, message=f"node {node.id} is gone ({status.reason}){why}")
    with store.db.transaction() as tx:  # ending the attempt released it; a draining node is released here
        if store.node(node_id, tx).state in WATCHED:
            store.update_node(tx, node_id, state=NODE_TERMINATING)
    ctx.nudge.set()


def unsaved_checkpoint_note(store, node: Node) -> str:
    """Why the next attempt resumes from an older step than the node trained to: a checkpoint of its attempt failed
    on the durable tier after the job's newest durable one (an emergency checkpoint held at a notice's deadline
    while the tier was unreachable, say). Empty when none did."""
    failure = store.last_event(node.job_id, EventKind.CHECKPOINT_FAILED.value)
    if failure is None or failure.attempt != node.attempt or "on the durable tier" not in (failure.message or ""):
        return ""
    checkpoint = (store.job(node.job_id).checkpoint or {})
    if checkpoint.get("attempt") == node.attempt and (checkpoint.get("time") or 0) > failure.time:
        return ""  # a later checkpoint of this attempt reached the durable tier
    newest = f"step {checkpoint['step']}" if checkpoint.get("step") is not None else "none"
    return f"; its newest durable checkpoint: {newest} ({failure.message})"
