"""A parent that keeps N worker processes running: starts them, knows when each is ready, starts one again when
it dies, and stops them all on SIGTERM or SIGINT (`runner server --workers N`, runner/controller/workers.py).

A worker says it is ready the way a service tells systemd (sd_notify, runner/sdnotify.py): the supervisor gives
each the address of a datagram socket of its own in ``NOTIFY_SOCKET``, and the worker sends ``READY=1`` once it
accepts connections, exactly as it does under systemd, then pings ``WATCHDOG=1`` from its event loop: one silent
for longer than the watchdog interval is killed and started again (runner/controller/worker_watchdog.py). The
socket receives every message with the sender's credentials as the kernel saw them (SO_PASSCRED), so a message is
matched to its worker by pid and no other process can speak for one.

No worker outlives the supervisor: each is started as a process group of its own (a Ctrl-C on the terminal
reaches the supervisor alone, which then stops the workers in order) with a parent-death signal, so even a
supervisor killed by SIGKILL takes its workers with it.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from ..parent_death import die_with_parent_preexec
from .worker_watchdog import WATCHDOG_SECONDS, Liveness, worker_environment

log = structlog.get_logger(__name__)

STOP_GRACE_SECONDS = 10.0  # a worker's own shutdown takes ~1 s (uvicorn drains for 5 s at most); then SIGKILL
QUICK_DEATH_SECONDS = 10.0  # a worker that dies sooner than this after its start is started again after a pause,
MAX_RESTART_PAUSE_SECONDS = 30.0  # doubling from 1 s up to this while it keeps dying (a database that is away)
POLL_SECONDS = 0.2
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class _Slot:
    number: int
    process: subprocess.Popen | None = None
    ready: bool = False
    started_at: float = 0.0
    quick_deaths: int = 0
    start_after: float = 0.0  # monotonic time before which a dead worker is not started again


def describe_exit(returncode: int) -> str:
    return f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"


class Supervisor:
    """``count`` processes of ``argv``; each gets ``stdin_for(slot)`` on its stdin (its settings) and ``env`` plus
    ``NOTIFY_SOCKET``. :meth:`run` blocks until SIGTERM or SIGINT, or until a worker fails to start before all
    were first ready (then its exit code is returned: a bad setting or an unreachable database, which starting it
    again would not fix). ``on_ready`` is called once, when every worker has said ``READY=1`` for the first time;
    ``on_turn`` at every turn of the loop (a few times a second: the parent pings systemd's watchdog from it). A
    worker ready and then silent for longer than ``watchdog_seconds`` is killed and started again."""

    def __init__(self, argv: list[str], count: int, stdin_for: Callable[[int], bytes], env: dict[str, str],
                 on_ready: Callable[[list[int]], None] = lambda pids: None, stop_grace: float = STOP_GRACE_SECONDS,
                 watchdog_seconds: float = WATCHDOG_SECONDS, on_turn: Callable[[], None] = lambda: None):
        self.argv, self.stdin_for, self.env, self.on_ready = list(argv), stdin_for, dict(env), on_ready
        self.stop_grace, self.on_turn = stop_grace, on_turn
        self.liveness = Liveness(watchdog_seconds)
        self.slots = [_Slot(number) for number in range(count)]
        self.serving = False  # every worker has been ready once
        self._stop_signal: int | None = None
        self._kill_now = False
        self._failed: int | None = None
        self._address = f"runner-workers-{os.getpid()}-{secrets.token_hex(4)}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._socket.bind(b"\0" + self._address.encode())  # an abstract address: nothing left on disk

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots if slot.process is not None]

    def run(self) -> int:
        """Supervise until told to stop; 0 after a stop by signal, else the exit code of a worker that could not
        start. Every worker has exited when this returns."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while self._stop_signal is None and self._failed is None:
                for slot in self.slots:
                    if slot.process is None and time.monotonic() >= slot.start_after:
                        self._start(slot)
                self._read_messages(POLL_SECONDS)
                for slot in self.slots:
                    self._kill_if_silent(slot)
                    self._check(slot)
                self.on_turn()
        finally:
            self._stop_all()
            self._socket.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._failed if self._failed is not None else 0

    # --- starting and watching ------------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        env = {**self.env, "NOTIFY_SOCKET": "@" + self._address, **worker_environment(self.liveness.seconds)}
        slot.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, env=env,
                                        preexec_fn=die_with_parent_preexec(signal.SIGTERM))
        slot.ready, slot.started_at = False, time.monotonic()
        try:
            slot.process.stdin.write(self.stdin_for(slot.number))  # a few hundred bytes: never fills the pipe
            slot.process.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: _check sees its exit
        log.info("controller worker started", worker=slot.number, pid=slot.process.pid)

    def _check(self, slot: _Slot) -> None:
        if slot.process is None or slot.process.poll() is None:
            return
        process, slot.process = slot.process, None
        self.liveness.forget(process.pid)
        if self._stop_signal is not None:
            return
        ran = time.monotonic() - slot.started_at
        if not self.serving and not slot.ready:  # the first start failed: its own error is on stderr already
            log.error("controller worker could not start; stopping the others", worker=slot.number, pid=process.pid,
                      exit=describe_exit(process.returncode))
            self._failed = process.returncode if process.returncode > 0 else 1
            return
        slot.quick_deaths = slot.quick_deaths + 1 if ran < QUICK_DEATH_SECONDS else 0
        pause = min(MAX_RESTART_PAUSE_SECONDS, 2.0 ** (slot.quick_deaths - 1)) if slot.quick_deaths else 0.0
        slot.start_after = time.monotonic() + pause
        log.error("controller worker exited; starting it again", worker=slot.number, pid=process.pid,
                  exit=describe_exit(process.returncode), ran_seconds=round(ran, 1), restart_in_seconds=pause)

    def _kill_if_silent(self, slot: _Slot) -> None:
        """A ready worker that has not pinged its watchdog for longer than the interval is stuck: SIGKILL it (its
        exit is then seen by :meth:`_check`, which starts it again)."""
        if slot.process is None or self._stop_signal is not None:
            return
        silent = self.liveness.silent_for(slot.process.pid)
        if silent is None:
            return
        log.error("controller worker stopped answering its watchdog; killing it", worker=slot.number,
                  pid=slot.process.pid, silent_seconds=round(silent, 1), watchdog_seconds=self.liveness.seconds)
        self.liveness.forget(slot.process.pid)
        _send(slot.process, signal.SIGKILL)

    def _read_messages(self, timeout: float) -> None:
        """Take every notification waiting (within ``timeout`` for the first) and mark the workers that are ready."""
        while select.select([self._socket], [], [], timeout)[0]:
            timeout = 0
            data, ancillary, _, _ = self._socket.recvmsg(4096, socket.CMSG_SPACE(_CREDENTIALS.size))
            pid = next((_CREDENTIALS.unpack(payload[:_CREDENTIALS.size])[0] for level, kind, payload in ancillary
                        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None)
            slot = next((s for s in self.slots if s.process is not None and s.process.pid == pid), None)
            lines = data.split(b"\n")
            if slot is not None and b"WATCHDOG=1" in lines:
                self.liveness.pinged(pid)
            if slot is None or b"READY=1" not in lines or slot.ready:
                continue
            slot.ready = True
            self.liveness.ready(pid)
            log.info("controller worker ready", worker=slot.number, pid=pid)
            if not self.serving and all(s.ready for s in self.slots):
                self.serving = True
                self.on_ready(self.pids())

    # --- stopping -------------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None:  # asked twice (a second Ctrl-C): no more waiting
            self._kill_now = True
        self._stop_signal = signum

    def _stop_all(self) -> None:
        """SIGTERM every worker, SIGKILL those still running after the grace (or at a second signal), reap all."""
        live = [slot.process for slot in self.slots if slot.process is not None and slot.process.poll() is None]
        if live:
            log.info("stopping controller workers", pids=[p.pid for p in live],
                     why=signal.Signals(self._stop_signal).name if self._stop_signal else "a worker could not start")
        for process in live:
            _send(process, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while any(p.poll() is None for p in live) and time.monotonic() < deadline and not self._kill_now:
            time.sleep(0.05)
        for process in live:
            if process.poll() is None:
                log.warning("controller worker did not stop in time; killing it", pid=process.pid)
                _send(process, signal.SIGKILL)
                process.wait()
        for slot in self.slots:
            slot.process = None


def _send(process: subprocess.Popen, sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass
