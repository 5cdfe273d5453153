"""The control channel between a training process and the node agent: the library's end (the client).

The messages are defined once, in runner/protocol (framing.py, messages.py), for both ends; this is what they
mean to the library.

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
  Under torch.distributed rank 0 sends ``committed`` (the checkpoint is one for the whole job); each other
  node's first process sends it with ``timing_only: true``, for its own agent to time the checkpoint.
  ``replicated: true`` when every rank holds the whole state (no sharded tensor), so that each rank's restore
  reads every file of the checkpoint.
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

The reader thread only records requests; all work happens in the training thread's ``step()``.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from runner.protocol.framing import encode, read_messages
from runner.protocol.messages import BadMessage, CheckpointRequest, Hello, Recorded, Release, Resume, World, parse

from .log import get_logger

log = get_logger()

__all__ = ["CheckpointRequest", "ControlClient", "describe_deadline"]  # CheckpointRequest: the protocol's, re-exported


def describe_deadline(deadline: float | None) -> str | None:
    """A deadline in unix seconds as people read it: ISO 8601 UTC and the seconds left."""
    if deadline is None:
        return None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    return f"{stamp} (in {max(0.0, deadline - time.time()):.1f} s)"


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
        self._on_world = on_world  # an elastic gang's ``world`` message, as it came (elastic.py)
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
        self.send(Hello(pid=os.getpid(), job_id=job_id, attempt=attempt, **(hello or {})).to_json())
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
        read_messages(self._sock, self._on_message, on_invalid=self._ignored)
        if not self._closed:
            log.warning("control channel closed by the agent; relying on signals only", path=self.path)
            if self._on_lost is not None:
                self._on_lost()

    def _on_message(self, data: dict) -> None:
        try:
            message = parse(data)
        except BadMessage as exc:  # an op of a newer agent, or a field this side cannot read
            log.debug("control message ignored", why=str(exc))
            return
        if isinstance(message, CheckpointRequest):
            self._on_request(message)
        elif isinstance(message, Recorded) and self._on_recorded is not None:
            self._on_recorded(message.step)
        elif isinstance(message, Release) and self._on_release is not None:
            self._on_release()
        elif isinstance(message, Resume) and self._on_resume is not None:
            self._on_resume(data)
        elif isinstance(message, World) and self._on_world is not None:
            self._on_world(data)

    @staticmethod
    def _ignored(line: bytes) -> None:
        log.debug("control message ignored", line=line[:200].decode(errors="replace"))

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
