"""The control channel between a training process and the node agent (client side, and the shared protocol).

Protocol, version 1
-------------------
Transport: a Unix stream socket whose filesystem path is in ``RUNNER_CONTROL``. The agent listens; the
training process (this library) connects once, when the ``Checkpointer`` is built. A failed connection
is one warning, after which the library relies on signals alone.

Framing: newline-delimited JSON; one UTF-8 JSON object per line, terminated by ``\\n``. Every object has
an ``op``. A receiver ignores unknown ops, unknown fields and lines that are not JSON objects.

Library -> agent:

* ``{"op": "hello", "pid": int, "job_id": str|null, "attempt": int|null}`` - right after connecting; under
  torch.distributed it adds ``rank``, ``local_rank`` and ``world_size``. Every rank connects and says hello.
* ``{"op": "restored", "step": int, "manifest": str|null}`` - after ``restore()``; step 0 and a null
  manifest for a fresh start; otherwise the path or URL of the manifest the state came from.
* ``{"op": "committed", "step": int, "manifest": str, "durable": bool, "emergency": bool,
  "seconds": float, "bytes": int}`` - after every commit: once with ``durable: false`` when the local
  tier has it, and once more with ``durable: true`` (and the durable manifest URL) when the durable tier
  has it. ``seconds`` runs from the start of the save; ``bytes`` is the checkpoint's size.
  Under torch.distributed only rank 0 sends ``committed`` (the checkpoint is one for the whole job).
* ``{"op": "stopping", "step": int, "durable": bool, "reason": str, "origin": "self"|"peer"}`` - when
  ``should_stop`` becomes true; ``durable`` says whether the emergency checkpoint reached the durable tier
  before the deadline; ``reason`` is the request's (``notice``, ``drill``, ``SIGTERM``...); ``origin`` is
  ``peer`` when another rank received the request and this one learned it through the process group.
* ``{"op": "failed", "step": int, "tier": "local"|"durable", "error": str}`` - a save did not commit on a
  tier (the previous checkpoint is kept; training goes on).
* ``{"op": "telemetry", "attempt": int|null, "steps": int, "steps_per_second": float|null,
  "nan_steps": int|null, "peak_memory_bytes": int|null, "memory": "gpu"|"host", "final": bool}`` - the
  training's figures (telemetry.py), batched: at most one every few seconds, one after each commit, and a
  final, exact one at ``close()``. ``steps`` counts the steps this process trained; ``nan_steps`` is null
  when no loss was reported. Every rank sends its own.
* ``{"op": "manifest", "manifest": {"git_commit", "git_dirty", "python", "torch", "cuda", "gpus",
  "packages_sha256", "argv"}}`` - once, at the first ``restore()`` (rank 0 only); unknown values are null.
* ``{"op": "request_seen", "reason": str, "step": int|null, "in_step": bool}`` - sent at once (by the
  library's reader thread, whatever the training thread is doing) for each ``checkpoint`` request with
  ``stop``: ``step`` is the last step passed to ``step()``, ``in_step`` whether the training thread is inside
  ``step()`` now (waiting for its peers). A rank that never says ``stopping`` is then known by how far it got.
* ``{"op": "world_changed", "generation": int, "step": int, "world_size": int}`` - an elastic gang's ranks
  moved to the world of ``generation`` at ``step`` (sent by rank 0 of the new world only; elastic.py).
* ``{"op": "closed", "step": int|null, "error": bool}`` - ``close()`` is done: the training is over (a
  sidecar agent cannot see the process exit). ``step`` is the last checkpoint's step; ``error`` is true
  when the Checkpointer's ``with`` block ended with an exception (the training failed).

Agent -> library:

* ``{"op": "checkpoint", "reason": "notice"|"rebalance"|"drill"|"cancel"|"move", "deadline": float|null,
  "stop": bool}``
  - ``deadline`` is in unix seconds. ``stop: true`` is the emergency path: the next ``step()`` saves,
  waits until the checkpoint is durable (or until the deadline minus a margin), sends ``stopping`` and
  sets ``should_stop``. ``stop: false`` asks for an opportunistic checkpoint; training goes on. The library
  hands ``reason`` to the training script as ``Checkpointer.stop_reason``.
* ``{"op": "recorded", "step": int}`` - the controller has recorded this durable checkpoint: it is the one the
  controller would hand the job's next attempt, so retention keeps it (retention.py) until a newer one is
  recorded. A node cut off from every controller gets none, and keeps what the controller knows.

* ``{"op": "world", "generation": int, "node_rank": int, "nnodes": int, "master_addr": str,
  "master_port": int}`` - an elastic gang's new world (``generation`` grows from 1; a repeated generation is
  ignored): this node's rank in it and where the new group's store listens (hosted by its global rank 0).
  Global rank = ``node_rank`` x local world size + ``LOCAL_RANK``. Survivors leave the old group at an
  agreed step (or at once when it is broken) and continue in the new one; a joining process waits for it
  in ``restore()`` (elastic.py).

The reader thread only records requests; all work happens in the training thread's ``step()``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from .log import get_logger

log = get_logger()

OPS_TO_AGENT = ("hello", "restored", "committed", "stopping", "failed", "telemetry", "manifest", "request_seen",
                "world_changed", "closed", "holding", "waiting")
OPS_FROM_AGENT = ("checkpoint", "recorded", "release", "resume", "world")
REASONS = ("notice", "rebalance", "drill", "cancel", "move")


def encode(message: dict) -> bytes:
    """One protocol line."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict | None:
    """Parse one protocol line; None when it is not a JSON object with an ``op``."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) and isinstance(message.get("op"), str) else None


def describe_deadline(deadline: float | None) -> str | None:
    """A deadline in unix seconds as people read it: ISO 8601 UTC and the seconds left."""
    if deadline is None:
        return None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    return f"{stamp} (in {max(0.0, deadline - time.time()):.1f} s)"


@dataclass(frozen=True)
class CheckpointRequest:
    """A request to checkpoint now: from the agent, or from a signal (``reason`` names it)."""

    reason: str
    stop: bool
    deadline: float | None = None  # unix seconds
    hold: bool = False  # checkpoint, then hold the training loop until stopped or released (hold.py)

    def merge(self, other: "CheckpointRequest | None") -> "CheckpointRequest":
        """The stronger of two pending requests: stop wins, and the earlier deadline."""
        if other is None:
            return self
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        stop = self.stop or other.stop
        reason = self.reason if self.stop or not other.stop else other.reason
        return CheckpointRequest(reason, stop, min(deadlines) if deadlines else None,
                                 hold=(self.hold or other.hold) and not stop)


def parse_request(message: dict) -> CheckpointRequest | None:
    """A ``checkpoint`` message as a request; None for anything else."""
    if message.get("op") != "checkpoint":
        return None
    deadline = message.get("deadline")
    if not isinstance(deadline, (int, float)) or isinstance(deadline, bool):
        deadline = None
    stop = bool(message.get("stop"))
    return CheckpointRequest(str(message.get("reason") or "notice"), stop,
                             float(deadline) if deadline is not None else None,
                             hold=bool(message.get("hold")) and not stop)


class ControlClient:
    """Connects to the agent, says hello, sends events, and hands requests to ``on_request``."""

    def __init__(self, path: str, on_request, job_id: str | None = None, attempt: int | None = None,
                 hello: dict | None = None, on_lost=None, on_recorded=None, on_release=None,
                 on_resume=None, on_world=None) -> None:
        self.path = path
        self._on_request = on_request
        self._on_lost = on_lost  # called once when the agent closes the channel before close()
        self._on_recorded = on_recorded
        self._on_release = on_release  # the agent ends a hold: training goes on (hold.py)
        self._on_resume = on_resume  # the agent names the step a process started ahead resumes from (resume_wait.py)
        self._on_world = on_world  # an elastic gang's ``world`` message, as it came
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5.0)
            sock.connect(path)
            sock.settimeout(None)
        except OSError as exc:
            sock.close()
            log.warning("control channel unreachable; relying on signals only", path=path, error=str(exc))
            return
        self._sock = sock
        self.send({"op": "hello", "pid": os.getpid(), "job_id": job_id, "attempt": attempt, **(hello or {})})
        self._reader = threading.Thread(target=self._read, name="runner-checkpoint-control", daemon=True)
        self._reader.start()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send(self, message: dict) -> None:
        """Send one message; a broken channel is logged once and then ignored."""
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(encode(message))
            except OSError as exc:
                log.warning("control channel lost; relying on signals only", path=self.path, error=str(exc))
                self._drop()

    def _read(self) -> None:
        sock = self._sock
        pending = b""
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                message = decode(line) if line.strip() else None
                request = parse_request(message) if message else None
                if request is not None:
                    self._on_request(request)
                elif message and message["op"] == "recorded" and self._on_recorded is not None:
                    step = message.get("step")
                    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                        self._on_recorded(step)
                elif message and message["op"] == "release" and self._on_release is not None:
                    self._on_release()
                elif message and message["op"] == "resume" and self._on_resume is not None:
                    self._on_resume(message)
                elif message and message["op"] == "world" and self._on_world is not None:
                    self._on_world(message)
                elif line.strip():
                    log.debug("control message ignored", line=line[:200].decode(errors="replace"))
        if not self._closed:
            log.warning("control channel closed by the agent; relying on signals only", path=self.path)
            if self._on_lost is not None:
                self._on_lost()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._drop()
