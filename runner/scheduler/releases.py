"""Releasing nodes: a node marked ``terminating`` is terminated through its provider, then recorded so.

Terminates are asked for here and answered later (:mod:`.cloud_calls`): a cloud that takes a minute to
terminate holds up nothing else. Each tick :func:`request_terminates` asks for every terminating node with
no terminate out, except one whose launch is still out (the launch's answer names what to terminate), and
:func:`apply_terminates` records each answer in its own transaction. A failed terminate is asked for again
on a later tick; so is one left out by a controller that stopped (terminate is idempotent).
"""

from __future__ import annotations

import time
from functools import partial

import structlog

from ..providers.errors import ProviderError
from ..state.store import NODE_TERMINATED, NODE_TERMINATING
from .cloud_calls import Answer

log = structlog.get_logger(__name__)

TERMINATED, RETRY, IGNORE = "terminated", "retry", "ignore"


def terminate_wakes(answer: Answer) -> bool:
    """A node terminated frees its job's next launch: wake the next tick. A failure waits for a later one."""
    return answer.error is None or not isinstance(answer.error, ProviderError)


def release_nodes(ctx) -> None:
    """Ask for the terminates that are due, then record what has come back (inline: this tick's own)."""
    request_terminates(ctx)
    apply_terminates(ctx)


def request_terminates(ctx) -> None:
    """Ask the provider to terminate every terminating node that has no terminate and no launch out."""
    launching, out = ctx.launches.keys_in_flight(), ctx.terminates.keys_in_flight()
    for node in ctx.store.nodes((NODE_TERMINATING,)):
        if node.id in out or node.id in launching:
            continue
        provider = ctx.providers[node.provider]
        ctx.terminates.request(node.id, partial(provider.terminate, node.id, node.provider_ref))


def release_step(error: BaseException | None, state_now: str | None) -> str:
    """What a terminate's answer means for the node: recorded as terminated, asked for again, or nothing (it
    is no longer terminating: another controller recorded it)."""
    if error is not None:
        return RETRY
    return TERMINATED if state_now == NODE_TERMINATING else IGNORE


def apply_terminates(ctx) -> None:
    """Every terminate answer that has come back, each in its own transaction (an unexpected error is raised last)."""
    store, unexpected = ctx.store, None
    for answer in ctx.terminates.answers():
        if answer.error is not None and not isinstance(answer.error, ProviderError):
            unexpected = unexpected or answer.error  # a bug: the terminate is asked for again next tick
            continue
        node = store.node(answer.key)
        ctx.guard.run("release", node.job_id if node else answer.key, _apply_terminate, store, answer)
    if unexpected is not None:
        raise unexpected


def _apply_terminate(store, answer: Answer) -> None:
    with store.db.transaction() as tx:
        node = store.node(answer.key, tx)
        step = release_step(answer.error, node.state if node else None)
        if step == TERMINATED:
            store.update_node(tx, node.id, state=NODE_TERMINATED, terminated_at=time.time())
    if step == TERMINATED:
        log.info("node released", node=node.id, job=node.job_id)
    elif step == RETRY:
        log.warning("terminate failed; will retry", node=answer.key, error=str(answer.error))
