"""EC2 instance metadata (IMDSv2): spot instance-action, rebalance recommendation, scheduled events.

Timing. Goal: detection p99 <= 0.5 s at <= 2 requests/s to IMDS in total. A notice appears at a moment
independent of our polls, so with one poll every P seconds the detection delay is uniform on [0, P]
and p99 = 0.99 P + one round trip (about a millisecond on the link-local address). So:

* ``spot/instance-action`` (the 2-minute warning): every 0.5 s -> 2 req/s, p99 = 0.495 s + RTT.
* ``events/recommendations/rebalance`` (advisory, usually minutes ahead): every 30 s -> 0.033 req/s.
* ``events/maintenance/scheduled`` (days ahead): every 300 s -> 0.003 req/s.
* the token (TTL 6 h, renewed when <= 15 s remain): one PUT per 6 h.

Total 2.04 req/s. The two goals meet exactly at P = 0.5 s: a p99 of 0.5 s *requires* two polls a
second on instance-action alone, so the two slow paths cost the remaining 2 %. They are constructor
arguments for those who prefer a different trade (AWS itself suggests polling every 5 s).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import requests
import structlog

from .base import Notice, Watcher, WatcherError, http_session, parse_iso, utcnow

log = structlog.get_logger(__name__)

LINK_LOCAL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
SCHEDULED_PATH = "/latest/meta-data/events/maintenance/scheduled"

ACTION_INTERVAL = 0.5
REBALANCE_INTERVAL = 30.0
SCHEDULED_INTERVAL = 300.0
DEFAULT_GRACE = 120.0  # used when the notice's time cannot be read

ACTIONS = ("terminate", "stop", "hibernate")
IGNORED_STATES = ("completed", "canceled")
_TOKEN = re.compile(r"^[A-Za-z0-9_+/=.-]{8,512}$")
_MONTHS = {m: i + 1 for i, m in enumerate(("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec").split())}

HOP_LIMIT_FIX = (
    "The IMDSv2 token request (PUT {endpoint}/latest/api/token) got no answer while GETs do: the PUT "
    "response hop limit is 1, so it is dropped on its way into a container. Fix: run the agent with "
    "host networking, or raise the limit: aws ec2 modify-instance-metadata-options --instance-id ID "
    "--http-put-response-hop-limit 2."
)


def parse_aws_date(text: str) -> datetime:
    """Scheduled events use ``21 Jan 2019 09:00:43 GMT``, not RFC 3339."""
    day, month, year, clock, zone = text.split()
    if zone != "GMT" or month not in _MONTHS:
        raise ValueError(f"not an AWS event date: {text!r}")
    hour, minute, second = (int(part) for part in clock.split(":"))
    return datetime(int(year), _MONTHS[month], int(day), hour, minute, second, tzinfo=timezone.utc)


def parse_instance_action(body: str) -> Notice:
    data = _json(body, ACTION_PATH)
    if not isinstance(data, dict) or data.get("action") not in ACTIONS:
        raise WatcherError(f"IMDS {ACTION_PATH} holds no known action ({body[:80]!r}); ignored")
    action = data["action"]
    try:
        deadline = parse_iso(str(data.get("time")))
    except ValueError:
        deadline = utcnow() + timedelta(seconds=DEFAULT_GRACE)
    if action == "hibernate":
        deadline = utcnow()  # hibernation gets no two-minute window
    return Notice.create("aws", "termination", action, terminal=True, deadline=deadline,
                         detail={"time": data.get("time")})


def parse_rebalance(body: str) -> Notice:
    data = _json(body, REBALANCE_PATH)
    if not isinstance(data, dict) or "noticeTime" not in data:
        raise WatcherError(f"IMDS {REBALANCE_PATH} holds no noticeTime ({body[:80]!r}); ignored")
    return Notice.create("aws", "rebalance", "rebalance", terminal=False,
                         detail={"noticeTime": data["noticeTime"], "issued_at": data["noticeTime"]})


def parse_scheduled(body: str) -> list[Notice]:
    data = _json(body, SCHEDULED_PATH)
    if not isinstance(data, list) or not all(isinstance(event, dict) for event in data):
        raise WatcherError(f"IMDS {SCHEDULED_PATH} is not a list of events ({body[:80]!r}); ignored")
    notices = []
    for event in data:
        if str(event.get("State", "active")).lower() in IGNORED_STATES or "EventId" not in event:
            continue
        try:
            deadline = parse_aws_date(str(event.get("NotBefore")))
        except ValueError:
            deadline = None
        notices.append(Notice.create("aws", "maintenance", str(event.get("Code", "unknown")), terminal=False,
                                     key=str(event["EventId"]), deadline=deadline, detail=event))
    return notices


def _unreachable(endpoint: str, exc: Exception) -> WatcherError:
    return WatcherError(f"IMDS at {endpoint} is unreachable ({type(exc).__name__}); is this an EC2 instance, "
                        "and is AWS_EC2_METADATA_SERVICE_ENDPOINT unset or right?")


def _json(body: str, path: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise WatcherError(f"IMDS {path} answered something that is not JSON ({body[:80]!r}); ignored") from None


class AWSWatcher(Watcher):
    """Watches one EC2 instance's metadata for spot interruptions and maintenance."""

    source = "aws"

    def __init__(self, endpoint: str = LINK_LOCAL, *, interval: float = ACTION_INTERVAL,
                 rebalance_interval: float = REBALANCE_INTERVAL, scheduled_interval: float = SCHEDULED_INTERVAL,
                 timeout: float = 1.0, put_timeout: float = 1.0, token_ttl: int = 21600,
                 refresh_margin: float = 15.0, allow_v1: bool = True, retry_put_after: float = 300.0):
        self.endpoint = endpoint.rstrip("/")
        self.interval = interval
        self.rebalance_interval = rebalance_interval
        self.scheduled_interval = scheduled_interval
        self.timeout = timeout
        self.put_timeout = put_timeout
        self.token_ttl = token_ttl
        self.refresh_margin = refresh_margin
        self.allow_v1 = allow_v1
        self.retry_put_after = retry_put_after
        self._session = http_session()
        self._token: str | None = None
        self._token_expiry = 0.0
        self._v1_until = 0.0  # while in the future, the token PUT is known to be dropped: use IMDSv1
        self._rebalance_due = 0.0
        self._scheduled_due = 0.0

    def check(self) -> list[Notice]:
        body = self._get(ACTION_PATH)
        notices = [] if body is None else [parse_instance_action(body)]
        if notices:
            return notices  # the slow paths can wait for the next round
        now = time.monotonic()
        if now >= self._rebalance_due:
            self._rebalance_due = now + self.rebalance_interval
            body = self._get(REBALANCE_PATH)
            notices += [] if body is None else [parse_rebalance(body)]
        if now >= self._scheduled_due:
            self._scheduled_due = now + self.scheduled_interval
            body = self._get(SCHEDULED_PATH)
            notices += [] if body is None or not body.strip() else parse_scheduled(body)
        return notices

    def close(self) -> None:
        self._session.close()

    @property
    def using_v1(self) -> bool:
        return time.monotonic() < self._v1_until

    # --- IMDS requests -----------------------------------------------------------
    def _get(self, path: str) -> str | None:
        """The item's text, or None when it is not present (404: the normal 'no notice')."""
        headers = self._auth_headers()
        response = self._request("GET", path, headers, self.timeout)
        if response.status_code == 401 and headers:  # token expired or revoked: a new one, once
            self._token = None
            headers = self._auth_headers()
            response = self._request("GET", path, headers, self.timeout)
        status = response.status_code
        if status == 200:
            return response.text
        if status == 404:
            return None
        if status == 401 and not headers:
            raise WatcherError(HOP_LIMIT_FIX.format(endpoint=self.endpoint) + " IMDSv1 is disabled here (401), "
                               "so no notice can be read until this is fixed.", persistent=True)
        if status == 403:
            raise WatcherError(f"IMDS at {self.endpoint} is turned off (403). Fix: aws ec2 "
                               "modify-instance-metadata-options --instance-id ID --http-endpoint enabled",
                               persistent=True)
        if status == 429:
            raise WatcherError(f"IMDS at {self.endpoint} is throttling us (429); backing off")
        raise WatcherError(f"IMDS at {self.endpoint} answered {status} for {path}")

    def _request(self, method: str, path: str, headers: dict[str, str], read_timeout: float) -> requests.Response:
        try:
            return self._session.request(method, self.endpoint + path, headers=headers, allow_redirects=False,
                                         timeout=(self.timeout, read_timeout))
        except requests.Timeout:
            raise WatcherError(f"IMDS at {self.endpoint} did not answer {method} {path} "
                               f"within {read_timeout:g} s") from None
        except requests.RequestException as exc:
            raise _unreachable(self.endpoint, exc) from None

    def _auth_headers(self) -> dict[str, str]:
        now = time.monotonic()
        if now < self._v1_until:
            return {}
        if self._token and self._token_expiry - now > self.refresh_margin:
            return {TOKEN_HEADER: self._token}
        self._token = None
        try:
            response = self._session.put(self.endpoint + TOKEN_PATH, headers={TTL_HEADER: str(self.token_ttl)},
                                         timeout=(self.timeout, self.put_timeout), allow_redirects=False)
        except requests.ReadTimeout:
            return self._put_dropped()
        except requests.RequestException as exc:
            raise _unreachable(self.endpoint, exc) from None
        if response.status_code == 200 and _TOKEN.match(response.text.strip()):
            try:
                ttl = min(self.token_ttl, int(response.headers.get(TTL_HEADER, self.token_ttl)))
            except ValueError:
                ttl = self.token_ttl
            self._token, self._token_expiry = response.text.strip(), now + ttl
            if self._v1_until:
                log.info("imds token request answered again; back on IMDSv2", endpoint=self.endpoint)
                self._v1_until = 0.0
            return {TOKEN_HEADER: self._token}
        if response.status_code == 403:
            raise WatcherError(f"IMDS at {self.endpoint} refused the token request (403): IMDS is turned off, "
                               "or the request went through a proxy (X-Forwarded-For). Fix: aws ec2 "
                               "modify-instance-metadata-options --instance-id ID --http-endpoint enabled",
                               persistent=True)
        if response.status_code == 400:
            raise WatcherError(f"IMDS refused token TTL {self.token_ttl} (400): it must be 1..21600",
                               persistent=True)
        raise WatcherError(f"IMDS token request answered {response.status_code} ({response.text[:40]!r})")

    def _put_dropped(self) -> dict[str, str]:
        """The PUT timed out: a dropped PUT (hop limit) if a plain GET still answers promptly, else a slow server."""
        probe = self._request("GET", ACTION_PATH, {}, self.timeout)
        if probe.status_code == 401:
            raise WatcherError(HOP_LIMIT_FIX.format(endpoint=self.endpoint) + " IMDSv1 is disabled here (401), "
                               "so no notice can be read until this is fixed.", persistent=True)
        if not self.allow_v1:
            raise WatcherError(HOP_LIMIT_FIX.format(endpoint=self.endpoint) + " (IMDSv1 fallback is off)",
                               persistent=True)
        log.error("imds token request dropped; falling back to IMDSv1",
                  endpoint=self.endpoint, fix=HOP_LIMIT_FIX.format(endpoint=self.endpoint),
                  retry_v2_in_s=self.retry_put_after)
        self._v1_until = time.monotonic() + self.retry_put_after
        return {}
