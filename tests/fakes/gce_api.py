"""A fake Compute Engine REST API on loopback: the instances and zone-operations calls the runner makes.

It speaks the JSON that ``google.cloud.compute_v1`` (REST transport) sends and parses, so tests drive
the real client against it. Like the real API, it reports capacity and quota failures in the zone
operation (already ``DONE``), not in the insert call, and records a ``compute.instances.preempted``
operation when it reclaims a Spot VM. Every request is recorded in ``requests``.

Controls: ``preempt``, ``delete_behind_our_back``, ``stop``, ``exhaust_zone``, ``exceed_quota``,
``fail_next`` (transient HTTP errors), ``deny`` (every call answers 401 or 403), ``forget_request_ids``,
``slow_operations`` (operations start RUNNING until waited on), ``hold_operations`` (waits return them
still RUNNING, as GCE's ``wait`` does when its deadline passes first, until released).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from loopback import LoopbackServer

BASE = "https://www.googleapis.com/compute/v1"
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ZONE_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/(?P<rest>.+)$")
POLICY_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)/resourcePolicies$")
CLAUSE = re.compile(r'^\(?\s*(?P<key>[\w.\-]+)\s*(?P<op>=|!=|eq|ne)\s*"?(?P<value>[^"()]*?)"?\s*\)?$')


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    body: dict | None


class APIError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


@dataclass
class FakeGCE(LoopbackServer):
    """The fake API; use as a context manager, then point the client at ``endpoint``."""

    project: str = "test-project"
    requests: list[Recorded] = field(default_factory=list)
    instances: dict[tuple[str, str], dict] = field(default_factory=dict)  # (zone, name) -> instance JSON
    policies: dict[tuple[str, str], dict] = field(default_factory=dict)  # (region, name) -> resource policy JSON
    operations: dict[str, list[dict]] = field(default_factory=dict)  # zone -> its operations, oldest first

    def __post_init__(self):
        self._lock = threading.RLock()
        self._ids = itertools.count(1000)
        self._by_request_id: dict[str, dict] = {}
        self._insert_errors: dict[str, dict] = {}  # zone -> the error block a failed insert operation carries
        self._sync_errors: dict[str, APIError] = {}  # zone -> an error the insert call itself answers
        self._transient: list[int] = []  # statuses the next requests answer, one each
        self._denied: int | None = None
        self._pending = False
        self._held = False
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def _handler_class(self):
        return _handler(self)

    # -- controls ----------------------------------------------------------------------------------
    def exhaust_zone(self, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED") -> None:
        """Inserts in ``zone`` end in a DONE operation carrying ``code`` (a stockout) and no VM."""
        message = (f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available "
                   "to fulfill the request.  Try a different zone, or try again later.")
        self._insert_errors[zone] = {"errors": [{"code": code, "message": message}],
                                     "status": 503, "status_message": "SERVICE UNAVAILABLE"}

    def exceed_quota(self, zone: str, quota: str = "GPUS_ALL_REGIONS", *, in_call: bool = False) -> None:
        """Inserts in ``zone`` fail on ``quota``: in the operation, or (``in_call``) as the insert's own 403."""
        message = f"Quota '{quota}' exceeded.  Limit: 0.0 globally."
        if in_call:
            self._sync_errors[zone] = APIError(403, "quotaExceeded", message)
            return
        detail = {"quotaInfo": {"metricName": f"compute.googleapis.com/{quota.lower()}", "limit": 0.0,
                                "limitName": f"{quota.replace('_', '-')}-per-project"}}
        self._insert_errors[zone] = {"errors": [{"code": "QUOTA_EXCEEDED", "message": message,
                                                 "errorDetails": [detail]}],
                                     "status": 403, "status_message": "FORBIDDEN"}

    def restore_zone(self, zone: str) -> None:
        """Inserts in ``zone`` succeed again."""
        self._insert_errors.pop(zone, None)
        self._sync_errors.pop(zone, None)

    def forget_request_ids(self) -> None:
        """Forget every requestId, as GCE does after an hour or more: a retried insert meets the VM's name."""
        self._by_request_id.clear()

    def slow_operations(self, pending: bool = True) -> None:
        """New operations start RUNNING and are DONE once waited on (``operations/{op}/wait``)."""
        self._pending = pending

    def hold_operations(self, held: bool = True) -> None:
        """New operations start RUNNING, and each ``wait`` on one returns it still RUNNING (after 0.1 s) while
        held; once released (``held=False``), the next ``wait`` finishes it."""
        self._held = held
        if held:
            self._pending = True

    def fail_next(self, *statuses: int) -> None:
        """The next requests answer these HTTP statuses (503, 500, 429...), one request each."""
        self._transient.extend(statuses)

    def deny(self, status: int | None = 403) -> None:
        """Every request answers 401 or 403 (None: stop denying)."""
        self._denied = status

    def preempt(self, zone: str, name: str, *, delete: bool | None = None) -> None:
        """Reclaim a Spot VM as GCE does: record ``compute.instances.preempted``, stop it, and delete it if
        its termination action is DELETE (or ``delete`` says so)."""
        with self._lock:
            instance = self.instances[(zone, name)]
            self._operation(zone, "compute.instances.preempted", instance, user="system",
                            statusMessage="Instance was preempted.")
            instance.update(status="TERMINATED", lastStopTimestamp=_now())
            action = instance.get("scheduling", {}).get("instanceTerminationAction", "STOP")
            if delete if delete is not None else action == "DELETE":
                del self.instances[(zone, name)]

    def delete_behind_our_back(self, zone: str, name: str) -> None:
        """Delete a VM as a person in the console would (a ``delete`` operation by someone else)."""
        with self._lock:
            instance = self.instances.pop((zone, name))
            self._operation(zone, "delete", instance, user="someone@example.com")

    def stop(self, zone: str, name: str) -> None:
        """Stop a VM as a person would: it stays, TERMINATED, with no preemption recorded."""
        with self._lock:
            instance = self.instances[(zone, name)]
            self._operation(zone, "stop", instance, user="someone@example.com")
            instance.update(status="TERMINATED", lastStopTimestamp=_now())

    def calls(self, method: str, suffix: str = "") -> list[Recorded]:
        """The recorded requests with this method whose path ends with ``suffix``."""
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    # -- the API -----------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], body: dict | None) -> tuple[int, dict]:
        if self._held and method == "POST" and path.endswith("/wait"):
            time.sleep(0.1)  # GCE's wait long-polls; a held one must not make the caller spin
        with self._lock:
            self.requests.append(Recorded(method, path, query, body))
            if self._denied:
                if self._denied == 401:
                    raise APIError(401, "authError", "Request had invalid authentication credentials.")
                raise APIError(self._denied, "forbidden",
                               f"Required 'compute.instances.create' permission for 'projects/{self.project}'")
            if self._transient:
                status = self._transient.pop(0)
                raise APIError(status, "backendError", f"Internal error (fake {status}). Please try again.")
            policy = POLICY_PATH.match(path)
            if policy and policy["project"] == self.project and method == "POST":
                return 200, self._insert_policy(policy["region"], body or {})
            match = ZONE_PATH.match(path)
            if not match or match["project"] != self.project:
                raise APIError(404, "notFound", f"The resource '{path}' was not found")
            zone, rest = match["zone"], match["rest"]
            parts = rest.split("/")
            if parts == ["instances"] and method == "POST":
                return 200, self._insert(zone, query.get("requestId"), body or {})
            if parts == ["instances"] and method == "GET":
                items = [i for (z, _), i in self.instances.items() if z == zone]
                return 200, self._page("compute#instanceList", items, query)
            if len(parts) == 2 and parts[0] == "instances" and method in ("GET", "DELETE"):
                instance = self.instances.get((zone, parts[1]))
                if instance is None:
                    raise APIError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                                   f"/instances/{parts[1]}' was not found")
                if method == "GET":
                    return 200, instance
                del self.instances[(zone, parts[1])]
                return 200, self._operation(zone, "delete", instance)
            if parts == ["operations"] and method == "GET":
                return 200, self._page("compute#operationList", self.operations.get(zone, []), query)
            if len(parts) in (2, 3) and parts[0] == "operations" and (
                    (method == "GET" and len(parts) == 2) or (method == "POST" and parts[2:] == ["wait"])):
                for operation in self.operations.get(zone, []):
                    if operation["name"] == parts[1]:
                        if parts[2:] == ["wait"] and not self._held:
                            operation.update(status="DONE", progress=100, endTime=_now())
                        return 200, operation
                raise APIError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                               f"/operations/{parts[1]}' was not found")
            raise APIError(400, "invalid", f"the fake does not implement {method} {path}")

    def _insert_policy(self, region: str, body: dict) -> dict:
        """resourcePolicies.insert: the policy exists at once; its region operation comes back DONE."""
        name = body.get("name", "")
        if (region, name) in self.policies:
            raise APIError(409, "alreadyExists",
                           f"The resource 'projects/{self.project}/regions/{region}/resourcePolicies/{name}' "
                           "already exists")
        self.policies[(region, name)] = {**body, "region": region, "status": "READY"}
        region_url = f"https://www.googleapis.com/compute/v1/projects/{self.project}/regions/{region}"
        return {"kind": "compute#operation", "name": f"operation-{uuid.uuid4().hex[:12]}", "status": "DONE",
                "progress": 100, "operationType": "insert", "region": region_url,
                "targetLink": f"{region_url}/resourcePolicies/{name}", "insertTime": _now(), "endTime": _now()}

    def _insert(self, zone: str, request_id: str | None, body: dict) -> dict:
        if request_id and request_id in self._by_request_id:
            return self._by_request_id[request_id]
        if zone in self._sync_errors:
            raise self._sync_errors[zone]
        name = body.get("name", "")
        if not NAME.match(name):
            raise APIError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. Must be a match "
                           "of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'")
        _validate(body)
        if (zone, name) in self.instances:
            raise APIError(409, "alreadyExists",
                           f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        instance = self._materialize(zone, body)
        error = self._insert_errors.get(zone)
        if error is None:
            self.instances[(zone, name)] = instance
        operation = self._operation(zone, "insert", instance, request_id=request_id, error=error)
        if request_id:
            self._by_request_id[request_id] = operation
        return operation

    def _materialize(self, zone: str, body: dict) -> dict:
        zone_url = f"{BASE}/projects/{self.project}/zones/{zone}"
        instance = json.loads(json.dumps(body))
        instance.update(kind="compute#instance", id=str(next(self._ids)), status="RUNNING", zone=zone_url,
                        creationTimestamp=_now(), lastStartTimestamp=_now(),
                        selfLink=f"{zone_url}/instances/{body['name']}",
                        machineType=_full(body["machineType"], self.project))
        for accelerator in instance.get("guestAccelerators", []):
            accelerator["acceleratorType"] = _full(accelerator["acceleratorType"], self.project)
        instance.setdefault("metadata", {})["fingerprint"] = "ZmFrZQ=="
        return instance

    def _operation(self, zone: str, kind: str, instance: dict, *, request_id: str | None = None,
                   error: dict | None = None, user: str = "runner@test-project.iam.gserviceaccount.com",
                   **extra) -> dict:
        number = next(self._ids)
        zone_url = f"{BASE}/projects/{self.project}/zones/{zone}"
        operation = {
            "kind": "compute#operation", "id": str(number), "name": f"operation-{number}-{kind.split('.')[-1]}",
            "zone": zone_url, "operationType": kind, "targetLink": f"{zone_url}/instances/{instance['name']}",
            "targetId": instance.get("id", ""), "status": "DONE", "user": user, "progress": 100,
            "insertTime": _now(), "startTime": _now(), "endTime": _now(),
            "selfLink": f"{zone_url}/operations/operation-{number}-{kind.split('.')[-1]}", **extra,
        }
        if self._pending and user != "system":
            operation.update(status="RUNNING", progress=0)
            del operation["endTime"]
        if request_id:
            operation["clientOperationId"] = request_id
        if error:
            operation["error"] = {"errors": error["errors"]}
            operation["httpErrorStatusCode"] = error["status"]
            operation["httpErrorMessage"] = error["status_message"]
        self.operations.setdefault(zone, []).append(operation)
        return operation

    def _page(self, kind: str, items: list[dict], query: dict[str, str]) -> dict:
        chosen = [i for i in items if _matches(i, query.get("filter", ""))]
        start = int(query.get("pageToken") or 0)
        size = int(query.get("maxResults") or 500)
        page = {"kind": kind, "items": chosen[start:start + size]}
        if start + size < len(chosen):
            page["nextPageToken"] = str(start + size)
        return page


def _full(partial: str, project: str) -> str:
    """The full URL the API reports for a partial resource name (``zones/Z/machineTypes/T``)."""
    if partial.startswith("https://"):
        return partial
    return f"{BASE}/{partial}" if partial.startswith("projects/") else f"{BASE}/projects/{project}/{partial}"


def _validate(body: dict) -> None:
    """The checks the real API makes that a builder could get wrong."""
    if not body.get("machineType"):
        raise APIError(400, "required", "Required field 'resource.machineType' not specified")
    if not any(d.get("boot") for d in body.get("disks", [])):
        raise APIError(400, "required", "Invalid value for field 'resource.disks': ''. Boot disk must be specified.")
    scheduling = body.get("scheduling", {})
    has_gpu = body.get("guestAccelerators") or re.search(r"(^|/)(a2|a3|g2)-", body["machineType"])
    if has_gpu and scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        raise APIError(400, "invalid", "Instances with guest accelerators do not support live migration.")
    if scheduling.get("provisioningModel") == "SPOT" and scheduling.get("automaticRestart", True):
        raise APIError(400, "invalid", "Invalid value for field 'resource.scheduling.automaticRestart': "
                       "'true'. Spot VMs cannot be restarted automatically.")


def _matches(item: dict, expression: str) -> bool:
    """A subset of the list filter: ``field = "value"`` clauses (also ``!=``, ``eq``, ``ne``) joined by AND."""
    if not expression.strip():
        return True
    for clause in re.split(r"\s+AND\s+", expression.strip(), flags=re.IGNORECASE):
        match = CLAUSE.match(clause.strip())
        if not match:
            raise APIError(400, "invalid", f"Invalid list filter expression '{expression}'.")
        value = item
        for key in match["key"].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        value = "" if value is None else str(value)
        op, wanted = match["op"], match["value"]
        equal = value == wanted if op in ("=", "!=") else re.fullmatch(wanted, value) is not None
        if equal != (op in ("=", "eq")):
            return False
    return True


def _handler(api: FakeGCE):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
                status, payload = api.handle(method, url.path, query, body)
            except APIError as exc:
                status, payload = exc.status, exc.body()
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def do_DELETE(self):
            self._serve("DELETE")

        def log_message(self, *args):
            pass

    return Handler
