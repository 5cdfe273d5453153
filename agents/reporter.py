"""What the agent tells the controller: registration, heartbeats, events, the end of the attempt.

Both modes use it. A sidecar without ``controller_url`` and ``token`` runs standalone: every call is then a
no-op and the agent's own log is the only record.

Events that the next attempt depends on (a durable checkpoint, a notice) are delivered reliably: a worker
thread retries them while the controller is unreachable or restarting, and the exit report waits for them,
so a checkpoint committed during a controller restart is not lost to the resume (the controller hands the
next attempt only the checkpoints it knows of). Other events are sent once, best effort.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import structlog

from runner.client import Client, ClientError
from runner.protocol.actions import Action
from runner.protocol.events import EventKind

from .config import AgentConfig

log = structlog.get_logger(__name__)
REGISTER_PATIENCE_SECONDS = 300.0
# The exit report is retried for this long, however fast each try is answered (a controller whose database is away
# answers 503 at once): a controller's failover or a database's restart, with room to spare.
EXIT_PATIENCE_SECONDS = 900.0
REFUSED = (401, 403, 409)  # a wrong token, another node's job, an attempt that has ended: retrying cannot help
# Events a resume depends on: retried, flushed before the exit report, delivered in the order they were sent.
# The attempt's telemetry too: its final report comes just before the exit. And the node's setup times, which
# tell when a new node is ready to train. And a gang node's ranks finished: its part of the attempt, after its ranks'
# last checkpoint and telemetry.
RELIABLE = frozenset({EventKind.CHECKPOINT, EventKind.NOTICE, EventKind.HANDOVER, EventKind.TELEMETRY, EventKind.MANIFEST,
                      EventKind.SETUP, EventKind.RANKS_FINISHED})
FLUSH_SECONDS = 30.0  # the least the exit report waits for reliable events still being retried


def _next_beat(interval: float, asked) -> float:
    """The wait before the next beat: the agent's interval, or less where the reply asked for a sooner one (a gang
    node while a peer is on notice: the word to start the next attempt ahead comes on a reply). A reply cannot
    slow the beats down, and each reply asks afresh."""
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked <= 0:
        return interval
    return min(interval, float(asked))


class Reporter:
    def __init__(self, client: Client | None, patience: float = REGISTER_PATIENCE_SECONDS, retry_every: float = 2.0,
                 least_flush: float = FLUSH_SECONDS, exit_patience: float = EXIT_PATIENCE_SECONDS):
        self.client = client
        self.patience = patience
        self.retry_every = retry_every
        self.least_flush = least_flush  # the exit report waits this long at least for reliable events
        self.exit_patience = exit_patience
        # (kind, data, on_delivered, when queued): each is retried until ``patience`` after it was queued
        self._outbox: queue.Queue[tuple[str, dict, Callable[[dict], None] | None, float]] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._beat_now = threading.Event()  # wakes the heartbeat thread for a beat at once (beat_now())

    @classmethod
    def for_config(cls, config: AgentConfig) -> "Reporter":
        return cls(Client(config.controller_url, config.token, timeout=10) if config.reports else None)

    @property
    def standalone(self) -> bool:
        return self.client is None

    def register(self, body: dict | None = None) -> dict | None:
        """The node's assignment (or, for a gang not yet complete, a reply saying to wait); None when the
        controller refuses this node or stays unreachable too long. ``body``: the node's ``address``."""
        if self.client is None:
            return None
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            try:
                return self.client.post("/v1/agent/register", body)
            except ClientError as exc:
                if exc.status in REFUSED:
                    log.error("registration refused", error=str(exc))
                    return None
                log.warning("controller not reachable yet", error=str(exc))
                time.sleep(2)
        log.error("the controller did not answer the registration in time", seconds=self.patience)
        return None

    def patiently(self, call: Callable[[], object], what: str):
        """Retry a call while the controller is unreachable or restarting; other errors raise."""
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return call()
            except ClientError as exc:
                if (exc.status is not None and exc.status < 500) or time.monotonic() > deadline:
                    raise
                log.warning("controller not reachable; retrying", what=what, error=str(exc))
                time.sleep(2)

    def event(self, kind: str, data: dict, on_delivered: Callable[[dict], None] | None = None) -> None:
        """Report an event; checkpoints and notices go through the retrying outbox, in order. ``on_delivered``
        (reliable events) is given the controller's answer once it has one."""
        if self.client is None:
            return
        if kind in RELIABLE:
            self._start_worker()
            self._outbox.put((kind, data, on_delivered, time.monotonic()))
            return
        try:
            self.client.post("/v1/agent/events", {"kind": kind, "data": data})
        except ClientError as exc:
            log.warning("event not delivered", kind=kind, error=str(exc))

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Wait until every reliable event is delivered (or given up); False if some are still pending."""
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks:
            if time.monotonic() > deadline:
                log.error("events still undelivered at the exit report", pending=self._outbox.unfinished_tasks)
                return False
            time.sleep(0.02)
        return True

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._deliver, name="reporter-outbox", daemon=True)
                self._worker.start()

    def _deliver(self) -> None:
        while True:
            kind, data, on_delivered, queued = self._outbox.get()
            try:
                reply = self._post_until_delivered(kind, data, queued)
                if reply is not None and on_delivered is not None:
                    on_delivered(reply)
            except Exception:  # noqa: BLE001 - a callback's bug must not stop the outbox
                log.exception("handling a delivered event failed", kind=kind)
            finally:
                self._outbox.task_done()

    def _post_until_delivered(self, kind: str, data: dict, queued: float) -> dict | None:
        deadline = queued + self.patience
        while True:
            try:
                reply = self.client.post("/v1/agent/events", {"kind": kind, "data": data})
                return reply if isinstance(reply, dict) else {}
            except ClientError as exc:
                if (exc.status is not None and exc.status < 500) or time.monotonic() > deadline:
                    log.error("event not delivered", kind=kind, error=str(exc), step=data.get("step"))
                    return None
                log.warning("event not delivered yet; retrying", kind=kind, error=str(exc))
                time.sleep(self.retry_every)

    def heartbeats(self, every: float | Callable[[], float], status: Callable[[], dict],
                   on_action: Callable[[str], None], stop: threading.Event,
                   on_world: Callable[[dict], None] | None = None,
                   on_prestart: Callable[[dict], None] | None = None) -> None:
        """Post ``status()`` every ``every`` seconds (a number, or asked before each wait) until ``stop``, in a
        thread; hand each reply's action on (and an elastic gang's ``world``, a gang's ``prestart``)."""
        if self.client is None:
            return
        interval = every if callable(every) else (lambda: every)

        def beat() -> None:
            while not stop.is_set():
                try:
                    reply = self.client.post("/v1/agent/heartbeat", status())
                    if not isinstance(reply, dict):  # a reply of another shape must not end the beats either
                        reply = {}
                    action = reply.get("action", Action.CONTINUE)  # a reply without one must not end the beats
                except ClientError as exc:
                    log.warning("heartbeat failed", error=str(exc))
                    action, reply = Action.CONTINUE, {}
                if on_world is not None and isinstance(reply.get("world"), dict):  # an elastic gang's new world
                    on_world(reply["world"])
                if on_prestart is not None and isinstance(reply.get("prestart"), dict):  # agents/gang_prestart.py
                    on_prestart(reply["prestart"])
                on_action(action)
                self._wait_for_beat(_next_beat(interval(), reply.get("beat_seconds")), stop)

        threading.Thread(target=beat, name="heartbeat", daemon=True).start()

    def beat_now(self) -> None:
        """Send the next heartbeat at once, not at the end of the interval: something it carries (an elastic
        joiner's ``joining``) is awaited by the controller."""
        self._beat_now.set()

    def _wait_for_beat(self, seconds: float, stop: threading.Event) -> None:
        """Until ``seconds`` have passed, ``beat_now()`` is called or ``stop`` is set (checked every 0.25 s)."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._beat_now.wait(min(left, 0.25)):
                break
        self._beat_now.clear()

    def report_exit(self, reason: str, code: int | None, message: str | None, drill: dict | None = None,
                    failure_kind: str | None = None) -> dict | None:
        """End the attempt at the controller; its reply (a drill's next attempt), or None."""
        if self.client is None:
            return None
        # The checkpoints, the notice and the final telemetry of this attempt first: the exit ends the attempt,
        # and a report that arrives after it is refused. So while the controller (or its database) is away the
        # exit waits for them, as long as they are retried at all (``patience`` from when each was queued).
        self.flush(max(self.least_flush, self.patience))
        body = {"reason": reason, "exit_code": code, "message": message, "drill": drill}
        if failure_kind:  # only when known (a controller without failure kinds ignores the field)
            body["failure_kind"] = failure_kind
        deadline = time.monotonic() + self.exit_patience
        while True:
            try:
                reply = self.client.post("/v1/agent/exit", body)
                log.info("exit reported", reason=reason, code=code)
                return reply
            except ClientError as exc:
                if exc.status and exc.status < 500:
                    log.error("exit report refused", error=str(exc))
                    return None
                if time.monotonic() > deadline:
                    log.error("the controller did not take the exit report in time; it will find the node gone",
                              seconds=self.exit_patience, error=str(exc))
                    return None
                log.warning("exit report failed; retrying", error=str(exc))
                time.sleep(self.retry_every)

    def drill(self, result: dict) -> dict | None:
        if self.client is None:
            return None
        try:
            return self.client.post("/v1/agent/drill", result)
        except ClientError as exc:
            log.error("drill result not delivered", error=str(exc))
            return None
