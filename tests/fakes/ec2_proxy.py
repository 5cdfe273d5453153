"""A reverse proxy on loopback in front of moto's EC2 server, for the answers moto cannot give.

Every request is forwarded unchanged and every answer comes back unchanged, except:

- ``refuse(code, zones)``: a ``RunInstances`` whose ``Placement.AvailabilityZone`` is in ``zones``
  (every ``RunInstances`` when ``zones`` is None) is answered with an EC2 Query-API error, as EC2
  itself writes it (``<Response><Errors><Error><Code>...``), with the HTTP status EC2 uses for that
  code: 500 for the capacity codes (so botocore retries them, as it does against EC2), 403 for
  ``UnauthorizedOperation``, 401 for ``AuthFailure``, 400 for other client errors. A launch that names
  a subnet instead of a zone is refused only when ``zones`` is None.
- ``reclaim_as_spot(instance_id)``: ``DescribeInstances`` answers show the instance with the state reason
  of a spot interruption (``Server.SpotInstanceTermination``); the test terminates it in moto itself.

- ``CreatePlacementGroup`` (which moto lacks) is answered by the proxy: ``placement_groups`` maps each
  group's name to its strategy; a second group of one name gets ``InvalidPlacementGroup.Duplicate``.
  ``launch_groups`` records the ``Placement.GroupName`` of every ``RunInstances`` (None without one).

Point a client at ``url`` (``AWS_ENDPOINT_URL``). ``refusals`` records each refused launch.
"""

from __future__ import annotations

import http.client
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

# The HTTP status EC2 answers with, per error code; anything else is a client error (400).
STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientAddressCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    "InternalError": 500,
    "Unavailable": 503,
    "AuthFailure": 401,
    "UnauthorizedOperation": 403,
}
MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the Availability Zone "
                                    "you requested ({zone}). Our system will be working on provisioning additional "
                                    "capacity.",
    "UnauthorizedOperation": "You are not authorized to perform this operation. User: "
                             "arn:aws:iam::123456789012:user/runner is not authorized to perform: ec2:RunInstances. "
                             "Encoded authorization failure message: runner-test-encoded-message",
}
SPOT_REASON = ("Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot instance termination")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                        "transfer-encoding", "upgrade", "content-length"})


@dataclass(frozen=True)
class Refusal:
    """One launch the proxy refused."""

    code: str
    zone: str | None
    instance_type: str | None


def error_body(code: str, message: str, request_id: str | None = None) -> bytes:
    """An EC2 Query-API error document, as EC2 sends it."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors>"
            f"<RequestID>{request_id or uuid.uuid4()}</RequestID></Response>").encode()


class EC2Proxy:
    """The proxy; use as a context manager. ``upstream`` is moto's server URL."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port or 80)
        self._lock = threading.Lock()
        self._rule: tuple[str, frozenset[str] | None, str | None] | None = None
        self._reclaimed: set[str] = set()
        self.refusals: list[Refusal] = []
        self.placement_groups: dict[str, str] = {}
        self.launch_groups: list[str | None] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- controls -------------------------------------------------------------------------------
    def refuse(self, code: str, zones: Iterable[str] | None = None, message: str | None = None) -> None:
        """Answer launches in ``zones`` (every launch when None) with the EC2 error ``code``."""
        with self._lock:
            self._rule = (code, None if zones is None else frozenset(zones), message)

    def reclaim_as_spot(self, instance_id: str) -> None:
        """Describe ``instance_id`` with the state reason of a spot interruption from now on."""
        with self._lock:
            self._reclaimed.add(instance_id)

    # --- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "EC2Proxy":
        self._thread = threading.Thread(target=self._server.serve_forever, name="ec2-proxy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(5)

    # --- the proxy ------------------------------------------------------------------------------
    def _placement_group(self, params: dict[str, str]) -> tuple[int, bytes] | None:
        """Answer CreatePlacementGroup as EC2 would; record the group of every launch."""
        action = params.get("Action")
        if action == "RunInstances":
            with self._lock:
                self.launch_groups.append(params.get("Placement.GroupName"))
            return None
        if action != "CreatePlacementGroup":
            return None
        name = params.get("GroupName", "")
        with self._lock:
            if name in self.placement_groups:
                return 400, error_body("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
            self.placement_groups[name] = params.get("Strategy", "")
        return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<CreatePlacementGroupResponse '
                     f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>{uuid.uuid4()}</requestId>'
                     f"<placementGroup><groupName>{escape(name)}</groupName><strategy>"
                     f"{escape(params.get('Strategy', ''))}</strategy><state>available</state></placementGroup>"
                     "</CreatePlacementGroupResponse>").encode()

    def _refusal(self, params: dict[str, str]) -> tuple[int, bytes] | None:
        if params.get("Action") != "RunInstances":
            return None
        zone, instance_type = params.get("Placement.AvailabilityZone"), params.get("InstanceType")
        with self._lock:
            rule = self._rule
            if rule is None:
                return None
            code, zones, message = rule
            if zones is not None and zone not in zones:
                return None
            self.refusals.append(Refusal(code, zone, instance_type))
        text = message or MESSAGES.get(code, "{code} (injected by the test proxy)").format(
            code=code, type=instance_type, zone=zone)
        return STATUS.get(code, 400), error_body(code, text)

    def _rewrite(self, params: dict[str, str], body: bytes) -> bytes:
        with self._lock:
            reclaimed = set(self._reclaimed)
        if params.get("Action") != "DescribeInstances" or not reclaimed:
            return body
        root = ET.fromstring(body)
        ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        changed = False
        for item in root.iter(f"{ns}item"):
            instance_id = item.find(f"{ns}instanceId")
            if instance_id is None or instance_id.text not in reclaimed:
                continue
            reason = item.find(f"{ns}stateReason")
            if reason is None:
                reason = ET.SubElement(item, f"{ns}stateReason")
            for child in list(reason):
                reason.remove(child)
            ET.SubElement(reason, f"{ns}code").text = SPOT_REASON[0]
            ET.SubElement(reason, f"{ns}message").text = SPOT_REASON[1]
            changed = True
        if not changed:
            return body
        if ns:
            ET.register_namespace("", ns[1:-1])
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 60  # an idle keep-alive connection is closed after this long, ending its thread

            def do_POST(self):
                self._forward()

            def do_GET(self):
                self._forward()

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                if "x-www-form-urlencoded" in (self.headers.get("Content-Type") or ""):
                    params.update({k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()})
                refused = proxy._refusal(params) or proxy._placement_group(params)
                if refused is not None:
                    self._answer(refused[0], [("Content-Type", "text/xml;charset=UTF-8"),
                                              ("Date", self.date_time_string())], refused[1])
                    return
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    content = answer.read()
                    if answer.status == 200:
                        content = proxy._rewrite(params, content)
                    kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP]
                    self._answer(answer.status, kept, content)
                finally:
                    upstream.close()

            def _answer(self, status: int, headers: list[tuple[str, str]], content: bytes):
                self.send_response_only(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args):  # quiet: the test's output is for the test
                pass

        return Handler
