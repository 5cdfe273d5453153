"""A fake Compute Engine metadata server, hanging GETs included.

Every request needs ``Metadata-Flavor: Google`` (403 without, and 403 with ``X-Forwarded-For``); every
answer carries ``Metadata-Flavor: Google`` and an ``ETag``. ``?wait_for_change=true&timeout_sec=N
&last_etag=E`` returns at once when ``E`` is already stale, otherwise when the value changes or after
``N`` seconds (with the unchanged value).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

from .base import FakeMetadataServer, Request, Response

ROOT = "/computeMetadata/v1/"
MAINTENANCE_VALUES = ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE")
DEFAULT_WAIT_SECONDS = 300


class FakeGCEMetadata(FakeMetadataServer):
    """Compute Engine metadata for one simulated VM; keys are paths under ``/computeMetadata/v1/``."""

    cloud = "gcp"
    server_header = "Metadata Server for VM"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, project_id: str = "runner-local",
                 zone: str = "local-a", instance_name: str = "node", machine_type: str = "n1-standard-4"):
        super().__init__(host, port)
        self._changed = threading.Condition(self._lock)
        self._initial = {
            "instance/id": "4520031799277581759",
            "instance/name": instance_name,
            "instance/hostname": f"{instance_name}.{zone}.c.{project_id}.internal",
            "instance/zone": f"projects/123456789012/zones/{zone}",
            "instance/machine-type": f"projects/123456789012/machineTypes/{machine_type}",
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/scheduling/preemptible": "TRUE",
            "instance/service-accounts/default/email": f"runner@{project_id}.iam.gserviceaccount.com",
            "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform",
            "project/project-id": project_id,
            "project/numeric-project-id": "123456789012",
        }
        self._values: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self.ignore_wait_for_change = False  # a broken server (or proxy) that answers every hanging GET at once
        self.reset_state()

    @property
    def endpoint(self) -> str:
        """``GCE_METADATA_HOST`` is host:port, without a scheme."""
        return f"{self._address[0]}:{self.port}"

    def reset_state(self) -> None:
        for key, value in self._initial.items():
            self._store(key, value)

    # --- injection (thread-safe) -------------------------------------------------
    def set_value(self, key: str, value: str) -> None:
        with self._changed:
            self._store(key.strip("/"), value)
            self._changed.notify_all()

    def value(self, key: str) -> str | None:
        with self._lock:
            return self._values.get(key.strip("/"))

    def etag(self, key: str) -> str:
        with self._lock:
            return _etag(key.strip("/"), self._versions.get(key.strip("/"), 0))

    def set_preempted(self, preempted: bool = True) -> None:
        self.set_value("instance/preempted", "TRUE" if preempted else "FALSE")

    def set_maintenance_event(self, value: str) -> None:
        if value not in MAINTENANCE_VALUES:
            raise ValueError(f"maintenance event {value!r} is not one of {', '.join(MAINTENANCE_VALUES)}")
        self.set_value("instance/maintenance-event", value)

    def preempt(self, deadline_seconds: float = 30.0) -> None:
        """A Spot VM preemption: ``preempted`` turns TRUE (the power-off follows ~30 s later)."""
        self.set_preempted(True)

    def admin(self, op: dict[str, Any]) -> dict[str, Any]:
        name = op.get("op")
        if name == "set":
            self.set_value(op["key"], str(op["value"]))
        elif name == "maintenance":
            self.set_maintenance_event(op.get("value", "TERMINATE_ON_HOST_MAINTENANCE"))
        else:
            return super().admin(op)
        return {"ok": True}

    def _store(self, key: str, value: str) -> None:
        if self._values.get(key) != value:
            self._values[key] = value
            self._versions[key] = self._versions.get(key, 0) + 1

    def _wake_waiters(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # --- protocol ---------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        if request.headers.get("X-Forwarded-For") is not None:
            return _answer(403, "Forbidden: X-Forwarded-For is not allowed on metadata requests.\n")
        if request.headers.get("Metadata-Flavor") != "Google":
            return _answer(403, "Your client does not have permission to get URL "
                                f"{request.path} from this server. Missing Metadata-Flavor:Google header.\n")
        if request.method != "GET":
            return _answer(405, "Method Not Allowed\n")
        if request.path in ("/", ""):
            return _answer(200, "computeMetadata/\n")
        if request.path.rstrip("/") == "/computeMetadata":
            return _answer(200, "v1/\n")
        if not request.path.startswith(ROOT):
            return _answer(404, "Not Found\n")
        key = request.path[len(ROOT):]
        with self._changed:
            if key.strip("/") in self._values and not key.endswith("/"):
                return self._leaf(key, request.query)
            return self._directory(key.strip("/"), request.query)

    def _leaf(self, key: str, query: dict[str, str]) -> Response:
        """Called with the lock held; a hanging GET waits on the condition, which releases it."""
        if query.get("wait_for_change", "").lower() == "true" and not self.ignore_wait_for_change:
            try:
                timeout = float(query.get("timeout_sec", DEFAULT_WAIT_SECONDS))
            except ValueError:
                return _answer(400, "timeout_sec must be a number\n")
            start = self._versions[key]
            last = query.get("last_etag")
            if last is None or last == _etag(key, start):
                give_up = time.monotonic() + timeout
                while self._versions[key] == start and not self._stopping.is_set():
                    left = give_up - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
        if query.get("alt") == "json":
            return _answer(200, json.dumps(self._values[key]), _etag(key, self._versions[key]), "application/json")
        return _answer(200, self._values[key], _etag(key, self._versions[key]))

    def _directory(self, prefix: str, query: dict[str, str]) -> Response:
        below = {k[len(prefix) + 1 if prefix else 0:]: v for k, v in self._values.items()
                 if not prefix or k.startswith(prefix + "/")}
        if not below:
            return _answer(404, "Not Found\n")
        version = sum(self._versions[(prefix + "/" + k) if prefix else k] for k in below)
        tag = _etag(prefix + "/", version)
        if query.get("recursive", "").lower() == "true":
            tree: dict[str, Any] = {}
            for name, value in below.items():
                *parents, leaf = name.split("/")
                node = tree
                for part in parents:
                    node = node.setdefault(_camel(part), {})
                node[_camel(leaf)] = value
            return _answer(200, json.dumps(tree), tag, "application/json")
        children = sorted({name.split("/")[0] + ("/" if "/" in name else "") for name in below})
        return _answer(200, "\n".join(children) + "\n", tag)


def _etag(key: str, version: int) -> str:
    return hashlib.sha1(f"{key}@{version}".encode()).hexdigest()[:16]


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.capitalize() for part in rest)


def _answer(status: int, body: str, etag: str | None = None, content_type: str = "application/text") -> Response:
    headers = {"Metadata-Flavor": "Google", "Content-Type": content_type}
    if etag:
        headers["ETag"] = etag
    return Response(status, body, headers)
