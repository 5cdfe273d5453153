"""Azure Scheduled Events: ``Preempt`` (spot eviction, >= 30 s ahead) and ``Terminate`` end the VM.

Polled once a second, as Azure recommends; Scheduled Events offers no long poll. The very first
request can take up to two minutes while the service starts for this VM, hence ``first_timeout``.
Freeze, Reboot and Redeploy are reported as non-terminal maintenance.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime

import requests
import structlog

from .base import Notice, Watcher, WatcherError, http_session, utcnow

log = structlog.get_logger(__name__)

LINK_LOCAL = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents"
API_VERSION = "2020-07-01"
TERMINAL_TYPES = ("Preempt", "Terminate")
ACTIVE_STATUSES = ("Scheduled", "Started")


def parse_events(document: object) -> list[Notice]:
    if not isinstance(document, dict) or not isinstance(document.get("Events"), list):
        raise WatcherError(f"Scheduled Events answered a document without an Events list ({str(document)[:80]!r})")
    notices = []
    for event in document["Events"]:
        if not isinstance(event, dict) or "EventId" not in event or "EventType" not in event:
            raise WatcherError(f"Scheduled Events holds a malformed event ({str(event)[:80]!r})")
        if event.get("EventStatus", "Scheduled") not in ACTIVE_STATUSES:
            continue
        kind_type = str(event["EventType"])
        terminal = kind_type in TERMINAL_TYPES
        try:
            deadline = parsedate_to_datetime(event["NotBefore"]) if event.get("NotBefore") else None
        except (TypeError, ValueError):
            deadline = None
        if terminal and deadline is None:
            deadline = utcnow()  # Started, or unreadable: it is happening now
        notices.append(Notice.create("azure", "termination" if terminal else "maintenance", kind_type.lower(),
                                     terminal=terminal, key=str(event["EventId"]), deadline=deadline,
                                     detail=event))
    return notices


class AzureWatcher(Watcher):
    """Polls Scheduled Events of one Azure VM."""

    source = "azure"

    def __init__(self, endpoint: str = LINK_LOCAL, *, interval: float = 1.0, timeout: float = 5.0,
                 first_timeout: float = 120.0, api_version: str = API_VERSION):
        self.url = endpoint.rstrip("/") + EVENTS_PATH
        self.interval = interval
        self.timeout = timeout
        self.first_timeout = first_timeout
        self.api_version = api_version
        self._session = http_session()
        self._answered = False
        self.incarnation: int | None = None

    def check(self) -> list[Notice]:
        response = self._request("GET", self.first_timeout if not self._answered else self.timeout)
        if response.status_code != 200:
            raise WatcherError(f"Scheduled Events at {self.url} answered {response.status_code} "
                               f"({response.text[:80]!r})", persistent=response.status_code == 400)
        self._answered = True
        try:
            document = response.json()
        except ValueError:
            raise WatcherError("Scheduled Events answered something that is not JSON "
                               f"({response.text[:80]!r})") from None
        notices = parse_events(document)
        incarnation = document.get("DocumentIncarnation")
        if incarnation != self.incarnation:
            log.debug("azure scheduled events changed", incarnation=incarnation, events=len(document["Events"]))
            self.incarnation = incarnation
        return notices

    def acknowledge(self, event_id: str) -> None:
        """Let the platform start the event now (for Preempt: after the emergency checkpoint)."""
        response = self._request("POST", self.timeout, json={"StartRequests": [{"EventId": event_id}]})
        if response.status_code != 200:
            raise WatcherError(f"Scheduled Events refused to start {event_id}: {response.status_code}")

    def close(self) -> None:
        self._session.close()

    def _request(self, method: str, read_timeout: float, **kwargs: object) -> requests.Response:
        try:
            return self._session.request(method, self.url, params={"api-version": self.api_version},
                                         headers={"Metadata": "true"}, timeout=(self.timeout, read_timeout),
                                         allow_redirects=False, **kwargs)
        except requests.Timeout:
            raise WatcherError(f"Scheduled Events at {self.url} did not answer within {read_timeout:g} s") from None
        except requests.RequestException as exc:
            raise WatcherError(f"Scheduled Events at {self.url} is unreachable ({type(exc).__name__}); is this an "
                               "Azure VM, and is RUNNER_AZURE_METADATA_ENDPOINT unset or right?") from None
