"""A process started ahead on a GPU node holds before its first CUDA use until the agent's word.

A gang's next attempt is started ahead on every node while the old one still trains (agents/gang_prestart.py). On
a kept GPU node the new ranks must not build their model, nor NCCL its communicators, on the GPUs the old ranks
still use: either could run out of memory. So the agent starts them with ``RUNNER_CUDA_GATE=1`` beside
``RUNNER_RESUME_WAIT=1``, and when this library is imported such a process wraps ``torch.cuda._lazy_init``: the
first CUDA use (``.cuda()``, ``torch.zeros(device="cuda")``, ``torch.cuda.set_device``...) says ``waiting`` with
``at: before_cuda`` on the control channel and blocks until the agent's ``resume``, which comes once the old
attempt's processes on the node are gone. The interpreter's start, the imports, the launcher and its rendezvous
are then behind it; CUDA's initialisation, the model on the GPU and NCCL are not. The replacement's ranks hold at
the same place (the kept ranks are not past it, and the first collective would wait for them anyway).

Why the wrap catches the first use: torch's Python calls ``_lazy_init()`` through torch.cuda's globals (the
wrapped attribute is that global; torch.cuda.memory and torch.cuda.random import the name, and are patched too),
and its C++ side (``torch::utils::device_lazy_init``, used by tensor creation and ``.to()``) looks up
``torch.cuda._lazy_init`` by name each time it has not initialised yet. Not caught: C++ that creates a context
without that path, such as an NCCL barrier, or ``init_process_group(device_id=...)`` which connects eagerly,
before any tensor is on the GPU.

Why here and not a ``sitecustomize`` put on the run command's PYTHONPATH: that would also catch a script that
touches CUDA before importing this library, but it would load into every Python the command starts (the
launcher, helpers that never talk to the agent), must find and chain to an existing sitecustomize (the first on
sys.path wins, a virtualenv's or a distribution's), is skipped by ``python -I``/``-E`` and by containers that
reset the path, and would need an import hook to wait for torch. Only a process that uses this library is started
ahead at all, so the library is where every such process passes; the one case it misses, CUDA initialised before
the import, is detected: one log line, ``waiting`` with ``at: after_cuda``, and a hold right at the import (a kept
node's agent stops that process, and the gang's next attempt starts anew at the handover, as it did before).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from runner.protocol import environment as env
from runner.protocol.framing import encode, read_messages
from runner.protocol.messages import BadMessage, Resume, Waiting, WaitingAt, parse

from .errors import CheckpointError
from .log import get_logger

log = get_logger()

GATE_VARIABLE = env.CUDA_GATE
CONNECT_SECONDS = 5.0


class CudaGate:
    """The hold and the word that ends it, once per process. ``hold()`` may be called by any thread: the first one
    says ``waiting`` and reads the channel, every one blocks until the word."""

    def __init__(self, cuda_module) -> None:
        self._cuda = cuda_module
        self._original = cuda_module._lazy_init
        self._patched: list = []  # the modules whose ``_lazy_init`` is the gated one
        self._opened = threading.Event()
        self._lock = threading.Lock()
        self._asked = False
        self._error: str | None = None
        self._channel: socket.socket | None = None  # the connection the hold said ``waiting`` on

    @property
    def open(self) -> bool:
        return self._opened.is_set()

    def arm(self) -> None:
        gated = self._gated
        for name, module in list(sys.modules.items()):
            if (name == "torch.cuda" or name.startswith("torch.cuda.")) \
                    and getattr(module, "_lazy_init", None) is self._original:
                module._lazy_init = gated
                self._patched.append(module)

    def _gated(self):
        if not self._opened.is_set() and not self._cuda.is_initialized():
            self.hold(WaitingAt.BEFORE_CUDA)
        return self._original()

    def hold(self, at: WaitingAt) -> None:
        """Say ``waiting`` (``at``) and block until the agent's ``resume``; raises CheckpointError when the agent
        went away first (nothing to resume: the job runs elsewhere)."""
        with self._lock:
            first, self._asked = not self._asked, True
        if first:
            self._ask(at)
        self._opened.wait()
        if self._error is not None:
            raise CheckpointError(self._error)

    def _ask(self, at: WaitingAt) -> None:
        path = os.environ.get(env.CONTROL)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not path:
                raise OSError(f"{env.CONTROL} is not set")
            sock.settimeout(CONNECT_SECONDS)
            sock.connect(path)
            sock.settimeout(None)
            local_ranks = os.environ.get("LOCAL_WORLD_SIZE", "")  # torchrun's: the agent waits for every local rank
            sock.sendall(encode(Waiting(os.getpid(), int(local_ranks) if local_ranks.isdigit() else None,
                                        at=at).to_json()))
        except OSError as exc:  # nobody to say the word: the process goes on as any attempt's would
            sock.close()
            log.warning("control channel unreachable: not holding before CUDA", path=path, error=str(exc))
            self.release()
            return
        log.info("started ahead of this attempt: holding before the first CUDA use until the agent's word",
                 at=str(at))
        self._channel = sock
        try:
            read_messages(sock, self._on_message)  # until the word (which ends the reading) or the agent's end
        finally:
            sock.close()  # the Checkpointer has its own connection
        if not self._opened.is_set():
            self._error = ("the node agent went away before this process's attempt started; nothing to resume "
                           "(the job runs elsewhere)")
            self._opened.set()

    def _on_message(self, data: dict) -> None:
        try:
            message = parse(data)
        except BadMessage:
            return
        if isinstance(message, Resume) and not self._opened.is_set():
            step = message.step
            if isinstance(step, int) and not isinstance(step, bool) and step > 0:
                os.environ[env.RESUME_STEP] = str(step)  # a Checkpointer built from now on is the attempt's
            os.environ.pop(env.RESUME_WAIT, None)
            log.info("the agent's word: CUDA may be used", resume_step=step)
            self.release()
            try:
                self._channel.shutdown(socket.SHUT_RD)  # no more to read here: the reading loop ends
            except OSError:
                pass

    def release(self) -> None:
        """Open the gate (the word came, here or to the Checkpointer's ``restore()``): later CUDA calls go
        straight to torch's own."""
        os.environ.pop(GATE_VARIABLE, None)
        for module in self._patched:
            if module._lazy_init is self._gated:
                module._lazy_init = self._original
        self._opened.set()


_gate: CudaGate | None = None


def install() -> CudaGate | None:
    """At the library's import: arm the gate in a process started ahead with ``RUNNER_CUDA_GATE=1``; where CUDA is
    already initialised, say so and hold here instead."""
    global _gate
    if _gate is not None or os.environ.get(GATE_VARIABLE) != "1" or os.environ.get(env.RESUME_WAIT) != "1":
        return _gate
    import torch

    gate = _gate = CudaGate(torch.cuda)
    if torch.cuda.is_initialized():
        log.warning("CUDA was initialised before runner.checkpoint was imported: this process, started ahead of its "
                    "attempt, cannot hold before its first CUDA use (import runner.checkpoint before any CUDA "
                    "call); holding here, where a GPU node still in use stops it and starts it anew at the handover")
        gate.hold(WaitingAt.AFTER_CUDA)
        return gate
    gate.arm()
    return gate


def holds() -> bool:
    """Whether this process holds (or will hold) before its first CUDA use, the word not come yet."""
    return _gate is not None and not _gate.open


def wait_open(timeout: float | None = None) -> bool:
    """Block, without saying ``waiting``, until the gate opens (at once where there is none); whether it is open."""
    return True if _gate is None else _gate._opened.wait(timeout)


def release() -> None:
    """The word came to the Checkpointer (``restore()`` reached before any CUDA use): no hold after it."""
    if _gate is not None:
        _gate.release()
