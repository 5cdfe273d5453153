"""Shipping the job's output to the controller as it is produced.

Bytes are kept from the last offset the controller confirmed, so a lost reply or a controller restart
resends rather than drops; the controller ignores bytes it already has.
"""

from __future__ import annotations

import base64
import threading
import time

import structlog

from runner.client import Client, ClientError

log = structlog.get_logger(__name__)
MAX_CHUNK = 256 << 10


class LogShipper:
    def __init__(self, client: Client, start_offset: int = 0, interval: float = 0.2, local_copy=None):
        self.client = client
        self.confirmed = start_offset  # the controller has every byte before this offset
        self.interval = interval
        self.local_copy = local_copy
        self._pending = bytearray()  # bytes from ``confirmed`` onwards
        self._lock = threading.Lock()
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
        with self._lock:
            chunk = bytes(self._pending[:MAX_CHUNK])
            offset = self.confirmed
        if not chunk:
            return True
        try:
            reply = self.client.post("/v1/agent/logs", {"offset": offset, "data_b64": base64.b64encode(chunk).decode()})
        except ClientError as exc:
            log.warning("log upload failed; will retry", error=str(exc), pending=len(self._pending))
            return False
        with self._lock:
            accepted = reply["offset"] - self.confirmed
            if accepted >= 0:
                del self._pending[:accepted]
                self.confirmed = reply["offset"]
        return True
