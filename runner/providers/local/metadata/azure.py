"""A fake Azure Instance Metadata Service, Scheduled Events part.

``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` (400 without it, or
without ``api-version``) answers ``{"DocumentIncarnation": n, "Events": [...]}``; ``NotBefore`` is
RFC 1123 (``Mon, 19 Sep 2016 18:29:47 GMT``). ``POST`` with ``{"StartRequests": [{"EventId": ...}]}``
acknowledges events. ``GET /metadata/instance`` gives the compute document used to detect Azure.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

from .base import FakeMetadataServer, Request, Response

EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")


def rfc1123(moment: datetime) -> str:
    return format_datetime(moment.astimezone(timezone.utc), usegmt=True)


class FakeScheduledEvents(FakeMetadataServer):
    """Scheduled Events for one simulated VM."""

    cloud = "azure"
    server_header = "Microsoft-IIS/10.0"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, vm_name: str = "node",
                 location: str = "local", vm_size: str = "Standard_NC4as_T4_v3"):
        super().__init__(host, port)
        self.vm_name = vm_name
        self.location = location
        self.vm_size = vm_size
        self.reset_state()

    def reset_state(self) -> None:
        self._incarnation = 1
        self._events: list[dict[str, Any]] = []
        self.acknowledged: list[str] = []

    # --- injection (thread-safe) -------------------------------------------------
    def add_event(self, event_type: str = "Preempt", *, deadline_seconds: float = 30.0,
                  status: str = "Scheduled", event_id: str | None = None, not_before: str | None = None) -> str:
        """Schedule an event ``deadline_seconds`` ahead (``not_before``: this NotBefore text, verbatim)."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"event type {event_type!r} is not one of {', '.join(EVENT_TYPES)}")
        event = {
            "EventId": event_id or str(uuid.uuid4()).upper(),
            "EventStatus": status,
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name],
            "NotBefore": not_before or rfc1123(datetime.now(timezone.utc) + timedelta(seconds=deadline_seconds)),
            "Description": f"{event_type} scheduled by the local provider",
            "EventSource": "Platform",
            "DurationInSeconds": -1 if event_type in ("Preempt", "Terminate") else 10,
        }
        with self._lock:
            self._events.append(event)
            self._incarnation += 1
        return event["EventId"]

    def clear_events(self) -> None:
        with self._lock:
            if self._events:
                self._events = []
                self._incarnation += 1

    def preempt(self, deadline_seconds: float = 30.0) -> None:
        """A Spot VM eviction: a Preempt event with NotBefore ``deadline_seconds`` ahead."""
        self.add_event("Preempt", deadline_seconds=deadline_seconds)

    def admin(self, op: dict[str, Any]) -> dict[str, Any]:
        if op.get("op") == "event":
            return {"event_id": self.add_event(op.get("type", "Preempt"),
                                               deadline_seconds=float(op.get("deadline_seconds", 30)),
                                               status=op.get("status", "Scheduled"))}
        return super().admin(op)

    # --- protocol ---------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        if request.path.rstrip("/") not in (EVENTS_PATH, INSTANCE_PATH):
            return _json(404, {"error": "Not found"})
        if (request.headers.get("Metadata") or "").lower() != "true":
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if "api-version" not in request.query:
            return _json(400, {"error": "Bad request. api-version was not specified in the request. "
                                        "For more information refer to aka.ms/azureimds",
                               "newest-versions": ["2021-02-01", "2020-07-01"]})
        if request.path.rstrip("/") == INSTANCE_PATH:
            vm_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, self.vm_name))
            return _json(200, {"compute": {"azEnvironment": "AzurePublicCloud", "location": self.location,
                                           "name": self.vm_name, "vmSize": self.vm_size, "priority": "Spot",
                                           "vmId": vm_id}})
        if request.method == "POST":
            return self._start_requests(request)
        if request.method != "GET":
            return _json(405, {"error": "Method not allowed"})
        with self._lock:
            return _json(200, {"DocumentIncarnation": self._incarnation, "Events": list(self._events)})

    def _start_requests(self, request: Request) -> Response:
        try:
            ids = [item["EventId"] for item in json.loads(request.body)["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return _json(400, {"error": 'Bad request. Expected {"StartRequests": [{"EventId": "..."}]}'})
        with self._lock:
            for event in self._events:
                if event["EventId"] in ids and event["EventStatus"] == "Scheduled":
                    event["EventStatus"] = "Started"
                    event["NotBefore"] = ""
                    self._incarnation += 1
            self.acknowledged.extend(ids)
        return Response(200, b"")


def _json(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload), {"Content-Type": "application/json; charset=utf-8"})
