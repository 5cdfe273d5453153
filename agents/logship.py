"""Shipping the job's output to the controller as it is produced.

Bytes are kept from the last offset the controller confirmed, so a lost reply or a controller restart
resends rather than drops; the controller ignores bytes it already has. The controller is also believed
only as far as it says: after a failed send (the controller died, or another one answers now) the shipper
asks for the offset the controller has stored and sends from there, and when that is less than what it had
confirmed (an acknowledged chunk that was not kept: a database that lost its last commits in a failover)
the missing bytes are read back from the node's own copy of the output (``local_copy``, the scratch
job.log) and sent again.
"""

from __future__ import annotations

import base64
import os
import threading
import time

import structlog

from runner.client import Client, ClientError

log = structlog.get_logger(__name__)
MAX_CHUNK = 256 << 10
OFFSET_PATH = "/v1/agent/logs/offset"


class LogShipper:
    def __init__(self, client: Client, start_offset: int = 0, interval: float = 0.2, local_copy=None):
        self.client = client
        self.confirmed = start_offset  # the controller has every byte before this offset
        self.interval = interval
        self.local_copy = local_copy
        # Where this stream's ``start_offset`` lies in the local copy (which holds every attempt's output).
        self._local_base = _size(local_copy) - start_offset if local_copy is not None else None
        self._start_offset = start_offset
        self._pending = bytearray()  # bytes from ``confirmed`` onwards
        self._resync = False  # ask the controller where it stands before the next send
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one send at a time: the thread's and a flush's
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)

    def start(self) -> "LogShipper":
        self._thread.start()
        return self

    def write(self, data: bytes) -> None:
        with self._lock:
            self._pending += data
            if self.local_copy is not None:
                self.local_copy.write(data)
                self.local_copy.flush()
        self._wake.set()

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything written so far; True when the controller has it all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._send_once():
                with self._lock:
                    if not self._pending:
                        return True
            else:
                time.sleep(0.5)
        return False

    def close(self, timeout: float = 30.0) -> bool:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        return self.flush(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._send_once():
                time.sleep(1.0)  # controller unreachable: keep the bytes, retry

    def _send_once(self) -> bool:
        with self._send_lock:
            if self._resync and not self._resynced():
                return False
            with self._lock:
                chunk = bytes(self._pending[:MAX_CHUNK])
                offset = self.confirmed
            if not chunk:
                return True
            try:
                reply = self.client.post("/v1/agent/logs",
                                         {"offset": offset, "data_b64": base64.b64encode(chunk).decode()})
            except ClientError as exc:
                log.warning("log upload failed; will retry", error=str(exc), pending=len(self._pending))
                self._resync = True
                return False
            self._move_to(reply["offset"])
            return True

    def _resynced(self) -> bool:
        """Learn the offset the controller has stored and continue from it; False while it cannot be asked."""
        try:
            stored = self.client.get(OFFSET_PATH)["offset"]
        except ClientError as exc:
            log.warning("log offset not known yet; will retry", error=str(exc))
            return False
        self._resync = False
        self._move_to(stored)
        return True

    def _move_to(self, stored: int) -> None:
        """The controller has every byte before ``stored``: drop what it has, or take back what it lost."""
        with self._lock:
            if stored >= self.confirmed:
                del self._pending[:stored - self.confirmed]
                self.confirmed = stored
                return
            lost = self._read_local(stored, self.confirmed)
            if lost is None:
                log.error("the controller lost output it had confirmed, and the node's copy cannot give it back",
                          stored=stored, confirmed=self.confirmed)
                return
            log.warning("the controller lost output it had confirmed; sending it again from the node's copy",
                        stored=stored, confirmed=self.confirmed)
            self._pending[:0] = lost
            self.confirmed = stored

    def _read_local(self, start: int, end: int) -> bytes | None:
        """Bytes ``start``..``end`` of this stream from the local copy; None when it does not hold them."""
        if self.local_copy is None or start < self._start_offset:
            return None
        try:
            with open(self.local_copy.name, "rb") as copy:
                copy.seek(self._local_base + start)
                data = copy.read(end - start)
        except (OSError, TypeError, ValueError):
            return None
        return data if len(data) == end - start else None


def _size(handle) -> int:
    handle.flush()
    return os.fstat(handle.fileno()).st_size
