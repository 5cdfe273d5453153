"""A fake EC2 instance metadata service (IMDSv2), faithful to the errors as well as to the answers.

Token: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds: 1..21600`` (400 when the
header is missing or out of range; 403 when the PUT carries ``X-Forwarded-For`` or goes to a versioned
token path). GETs carry ``X-aws-ec2-metadata-token``: 401 when it is missing (IMDSv2 required), unknown
or expired. 404 for an item that is not present, 403 for everything while IMDS is turned off.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from .base import FakeMetadataServer, Request, Response

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL = 21600
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def iso_time(moment: datetime) -> str:
    """Spot and rebalance notices: ``2017-09-18T08:22:00Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduled_time(moment: datetime) -> str:
    """Scheduled events: ``21 Jan 2019 09:00:43 GMT`` (not RFC 3339; month names never localised)."""
    m = moment.astimezone(timezone.utc)
    return f"{m.day} {_MONTHS[m.month - 1]} {m.year} {m:%H:%M:%S} GMT"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class FakeIMDS(FakeMetadataServer):
    """EC2 instance metadata for one simulated instance.

    ``require_token=False`` allows IMDSv1 (GETs without a token). ``recompute_time=True`` recomputes
    the notice's ``time`` on every request, as the official amazon-ec2-metadata-mock does.
    """

    cloud = "aws"
    server_header = "EC2ws"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, require_token: bool = True,
                 recompute_time: bool = False, instance_id: str = "i-0123456789abcdef0",
                 instance_type: str = "g4dn.xlarge", availability_zone: str = "us-east-1a"):
        super().__init__(host, port)
        self.require_token = require_token
        self.recompute_time = recompute_time
        self.instance_id = instance_id
        self.instance_type = instance_type
        self.availability_zone = availability_zone
        self._tokens: dict[str, float] = {}
        self.reset_state()

    def reset_state(self) -> None:
        self._tokens = {}
        self._disabled = False
        self._action: tuple[str, datetime, float] | None = None  # action, time, seconds ahead
        self._rebalance: datetime | None = None
        self._scheduled: list[dict[str, str]] | None = None

    # --- injection (thread-safe) ----------------------------------------------
    def set_instance_action(self, action: str = "terminate", deadline_seconds: float = 120.0,
                            time_text: str | None = None) -> None:
        """The spot interruption ``deadline_seconds`` ahead (``time_text``: this ``time`` value, verbatim)."""
        if action not in ("terminate", "stop", "hibernate"):
            raise ValueError(f"instance action {action!r} is not terminate, stop or hibernate")
        with self._lock:
            self._action = (action, _now() + timedelta(seconds=deadline_seconds), deadline_seconds)
            self._action_time_text = time_text

    def clear_instance_action(self) -> None:
        with self._lock:
            self._action = None

    def set_rebalance(self, notice_time: datetime | None = None) -> None:
        with self._lock:
            self._rebalance = notice_time or _now()

    def clear_rebalance(self) -> None:
        with self._lock:
            self._rebalance = None

    def add_scheduled_event(self, code: str = "system-reboot", *, state: str = "active",
                            not_before_seconds: float = 7 * 86400, duration_seconds: float = 7200,
                            event_id: str | None = None, description: str = "scheduled maintenance") -> str:
        start = _now() + timedelta(seconds=not_before_seconds)
        event = {
            "NotBefore": scheduled_time(start),
            "Code": code,
            "Description": description,
            "EventId": event_id or f"instance-event-{uuid.uuid4().hex[:17]}",
            "NotAfter": scheduled_time(start + timedelta(seconds=duration_seconds)),
            "State": state,
        }
        with self._lock:
            self._scheduled = [*(self._scheduled or []), event]
        return event["EventId"]

    def set_scheduled_state(self, event_id: str, state: str) -> None:
        with self._lock:
            for event in self._scheduled or []:
                if event["EventId"] == event_id:
                    event["State"] = state

    def expire_tokens(self) -> None:
        """Every token issued so far stops working (as after its TTL)."""
        with self._lock:
            self._tokens.clear()

    def set_disabled(self, disabled: bool = True) -> None:
        """IMDS turned off on the instance: every request gets 403."""
        with self._lock:
            self._disabled = disabled

    def preempt(self, deadline_seconds: float = 120.0) -> None:
        """A spot interruption: the rebalance recommendation, then the instance action."""
        self.set_rebalance()
        self.set_instance_action("terminate", deadline_seconds)

    def admin(self, op: dict[str, Any]) -> dict[str, Any]:
        name = op.get("op")
        if name == "instance_action":
            self.set_instance_action(op.get("action", "terminate"), float(op.get("deadline_seconds", 120)))
        elif name == "rebalance":
            self.set_rebalance()
        elif name == "scheduled_event":
            return {"event_id": self.add_scheduled_event(
                op.get("code", "system-reboot"), state=op.get("state", "active"),
                not_before_seconds=float(op.get("not_before_seconds", 7 * 86400)))}
        elif name == "expire_tokens":
            self.expire_tokens()
        elif name == "disable":
            self.set_disabled(bool(op.get("disabled", True)))
        else:
            return super().admin(op)
        return {"ok": True}

    # --- protocol -------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        with self._lock:
            if self._disabled:
                return _text(403, "Forbidden")
            if request.method == "PUT":
                return self._put_token(request)
            if request.path == TOKEN_PATH:
                return _text(405, "Method Not Allowed")
            if request.method != "GET":
                return _text(405, "Method Not Allowed")
            token = request.headers.get(TOKEN_HEADER)
            if token is not None:
                expiry = self._tokens.get(token)
                if expiry is None or expiry <= time.monotonic():
                    self._tokens.pop(token, None)
                    return _text(401, "Unauthorized")
            elif self.require_token:
                return _text(401, "Unauthorized")
            value = self._item(request.path.rstrip("/") or "/")
        return _text(404, "Not Found") if value is None else _text(200, value)

    def _put_token(self, request: Request) -> Response:
        if request.headers.get("X-Forwarded-For") is not None:
            return _text(403, "Forbidden")
        if request.path != TOKEN_PATH:
            return _text(403, "Forbidden") if request.path.endswith("/api/token") else _text(405, "Method Not Allowed")
        raw = request.headers.get(TTL_HEADER)
        try:
            ttl = int(raw)
        except (TypeError, ValueError):
            return _text(400, "Bad Request")
        if not 1 <= ttl <= MAX_TTL:
            return _text(400, "Bad Request")
        token = secrets.token_urlsafe(42)
        self._tokens[token] = time.monotonic() + ttl
        return Response(200, token, {"Content-Type": "text/plain", TTL_HEADER: str(ttl)})

    def _item(self, path: str) -> str | None:
        base = "/latest/meta-data"
        region = self.availability_zone[:-1]
        if path == "/latest/dynamic/instance-identity/document":
            return json.dumps({"instanceId": self.instance_id, "instanceType": self.instance_type,
                               "availabilityZone": self.availability_zone, "region": region,
                               "accountId": "123456789012", "imageId": "ami-0123456789abcdef0"})
        if not path.startswith(base):
            return "dynamic\nmeta-data" if path == "/latest" else None
        now = _now()
        items: dict[str, str | None] = {
            "": "ami-id\nevents/\nhostname\niam/\ninstance-id\ninstance-type\nlocal-ipv4\nplacement/\nspot/",
            "/ami-id": "ami-0123456789abcdef0",
            "/hostname": "ip-10-0-0-1.ec2.internal",
            "/local-ipv4": "10.0.0.1",
            "/instance-id": self.instance_id,
            "/instance-type": self.instance_type,
            "/placement": "availability-zone\nregion",
            "/placement/availability-zone": self.availability_zone,
            "/placement/region": region,
            "/events": "maintenance/\nrecommendations/",
            "/events/maintenance": "scheduled",
            "/iam": "info\nsecurity-credentials/",
            "/iam/info": json.dumps({"Code": "Success", "InstanceProfileArn":
                                     "arn:aws:iam::123456789012:instance-profile/runner-node"}),
            "/iam/security-credentials": "runner-node",
            "/iam/security-credentials/runner-node": json.dumps({
                "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "ASIAFAKEFAKEFAKEFAKE",
                "SecretAccessKey": "fake-secret", "Token": "fake-session-token",
                "Expiration": iso_time(now + timedelta(hours=6)), "LastUpdated": iso_time(now)}),
        }
        if self._scheduled is not None:
            items["/events/maintenance/scheduled"] = json.dumps(self._scheduled)
        if self._rebalance is not None:
            items["/events/recommendations"] = "rebalance"
            items["/events/recommendations/rebalance"] = json.dumps({"noticeTime": iso_time(self._rebalance)})
        if self._action is not None:
            action, at, ahead = self._action
            if self.recompute_time:
                at = now + timedelta(seconds=ahead)
            items["/spot"] = "instance-action\ntermination-time"
            text = getattr(self, "_action_time_text", None) or iso_time(at)
            items["/spot/instance-action"] = json.dumps({"action": action, "time": text})
            items["/spot/termination-time"] = iso_time(at)
        return items.get(path[len(base):])


def _text(status: int, body: str) -> Response:
    return Response(status, body, {"Content-Type": "text/plain"})
