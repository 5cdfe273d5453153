"""The agent's reports: a checkpoint committed while the controller is down still reaches it, before the exit."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.reporter import Reporter, _next_beat
from polling import eventually
from runner.client import Client


class FlakyController:
    """A controller on loopback that answers 503 to the first ``failures`` event posts, and records the rest."""

    def __init__(self, failures: int):
        self.failures = failures
        self.received: list[tuple[str, dict]] = []
        self.heartbeat_reply: dict | None = None  # what a heartbeat is answered (else ``{"accepted": true}``)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/v1/agent/events" and outer.failures > 0:
                    outer.failures -= 1
                    return self._send(503, {"detail": "restarting"})
                outer.received.append((self.path, body))
                if self.path == "/v1/agent/heartbeat" and outer.heartbeat_reply is not None:
                    return self._send(200, outer.heartbeat_reply)
                self._send(200, {"accepted": True})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = "http://%s:%d" % self.server.server_address[:2]


@pytest.fixture
def flaky():
    controller = FlakyController(failures=3)
    yield controller
    controller.server.shutdown()
    controller.server.server_close()


def test_a_checkpoint_reported_during_an_outage_arrives_before_the_exit(flaky):
    """Three 503s later the checkpoint is delivered, and the exit report waits for it."""
    reporter = Reporter(Client(flaky.url, "node-token", timeout=5), patience=30, retry_every=0.05)
    reporter.event("checkpoint", {"step": 42, "durable": True})
    reporter.report_exit("preempted", 0, "emergency checkpoint at step 42")
    paths = [path for path, _ in flaky.received]
    assert paths == ["/v1/agent/events", "/v1/agent/exit"]
    assert flaky.received[0][1] == {"kind": "checkpoint", "data": {"step": 42, "durable": True}}


def test_best_effort_events_are_sent_once(flaky):
    """A plain message event that meets an outage is dropped, not retried (only checkpoints and notices are)."""
    reporter = Reporter(Client(flaky.url, "node-token", timeout=5), patience=30, retry_every=0.05)
    reporter.event("message", {"message": "hello"})
    assert flaky.received == [] and flaky.failures == 2


class DatabaseOutage:
    """A controller whose database is away until ``back`` is set: every request is a 500 then. Every request is
    recorded as it arrives; once the exit report is in, the node's token no longer works (401), as when the
    controller has released the node."""

    def __init__(self):
        self.back = threading.Event()
        self.arrived: list[tuple[str, dict]] = []
        self.stored_steps: int | None = None
        self.exited = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                outer.arrived.append((self.path, body))
                if not outer.back.is_set():
                    return self._send(500, {"detail": "Internal Server Error"})
                if outer.exited:
                    return self._send(401, {"detail": "invalid token"})
                if self.path == "/v1/agent/exit":
                    outer.exited = True
                elif body.get("kind") == "telemetry":
                    outer.stored_steps = body["data"]["steps"]
                self._send(200, {"accepted": True})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = "http://%s:%d" % self.server.server_address[:2]


def test_the_exit_report_waits_out_a_long_outage_behind_the_final_telemetry():
    """The run ends while the controller's database is away for longer than the exit's least wait (30 s by
    default, 1 s here): the exit report is not sent before the telemetry queued ahead of it, so the attempt's steps
    are the final report's (500), not the last one stored before the outage (the row said 70)."""
    outage = DatabaseOutage()
    try:
        reporter = Reporter(Client(outage.url, "node-token", timeout=5), patience=120, retry_every=0.2,
                            least_flush=1.0)
        reporter.event("telemetry", {"steps": 70})
        reporter.event("telemetry", {"steps": 500, "final": True})
        done = threading.Event()
        threading.Thread(target=lambda: (reporter.report_exit("succeeded", 0, None), done.set()),
                         daemon=True).start()
        # Longer than the exit's least wait: poll the arrivals for 3 s, then bring the database back.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(p == "/v1/agent/exit" for p, _ in outage.arrived):
            time.sleep(0.1)
        outage.back.set()
        assert done.wait(120), "the exit report was never sent"
        assert outage.stored_steps == 500
        first_exit = next(i for i, (path, _) in enumerate(outage.arrived) if path == "/v1/agent/exit")
        last_event = max(i for i, (path, _) in enumerate(outage.arrived) if path == "/v1/agent/events")
        assert last_event < first_exit, "the exit report was sent while telemetry was still undelivered"
    finally:
        outage.server.shutdown()
        outage.server.server_close()


def test_the_heartbeat_interval_is_asked_before_each_wait(flaky):
    """A node on notice awaiting the controller's word beats faster: the interval is read before every wait."""
    reporter = Reporter(Client(flaky.url, "node-token", timeout=5), patience=30)
    stop = threading.Event()
    asked: list[float] = []

    def interval() -> float:
        asked.append(0.05 if len(asked) >= 2 else 0.3)  # the third wait on is short: the word is awaited
        return asked[-1]

    reporter.heartbeats(interval, lambda: {"phase": "running"}, lambda action: None, stop)
    beats = lambda: sum(1 for path, _ in flaky.received if path == "/v1/agent/heartbeat")  # noqa: E731
    deadline = time.monotonic() + 120
    while beats() < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    assert beats() >= 6 and asked[:3] == [0.3, 0.3, 0.05]


def test_beat_now_sends_the_next_heartbeat_at_once_with_the_status_of_then(flaky):
    """An elastic joiner's training says it waits: the beat that tells the controller goes now, not at the end of
    the interval (an hour here), and carries the status as it is then."""
    reporter = Reporter(Client(flaky.url, "node-token", timeout=5), patience=30)
    stop = threading.Event()
    status = {"phase": "running", "progress": {}}
    reporter.heartbeats(3600.0, lambda: json.loads(json.dumps(status)), lambda action: None, stop)
    beats = lambda: [body for path, body in flaky.received if path == "/v1/agent/heartbeat"]  # noqa: E731
    deadline = time.monotonic() + 60
    while not beats() and time.monotonic() < deadline:
        time.sleep(0.02)
    status["progress"]["joining"] = True
    reporter.beat_now()
    while len(beats()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    reporter.beat_now()  # the thread sees the stop at once
    assert len(beats()) == 2 and beats()[1]["progress"] == {"joining": True}


def test_a_reply_that_asks_for_sooner_beats_gets_them(flaky):
    """A gang node while a peer is on notice: the word to start the next attempt ahead comes on a reply, and the
    controller asks for the next beat sooner than the agent's interval (an hour here)."""
    flaky.heartbeat_reply = {"action": "continue", "beat_seconds": 0.05}
    reporter = Reporter(Client(flaky.url, "node-token", timeout=5), patience=30)
    stop = threading.Event()
    reporter.heartbeats(3600.0, lambda: {"phase": "running"}, lambda action: None, stop)
    beats = lambda: sum(1 for path, _ in flaky.received if path == "/v1/agent/heartbeat")  # noqa: E731
    deadline = time.monotonic() + 120
    while beats() < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    reporter.beat_now()  # the thread sees the stop at once
    assert beats() >= 3


def test_a_reply_cannot_slow_the_beats_and_a_malformed_ask_is_ignored():
    assert _next_beat(2.0, 0.5) == 0.5
    assert _next_beat(2.0, 30) == 2.0  # never slower than the agent's own interval
    for asked in (None, 0, -1, True, "0.5", [0.5]):
        assert _next_beat(2.0, asked) == 2.0


def test_the_exit_report_is_retried_for_its_patience_however_fast_each_refusal_comes():
    """A controller whose database is away answers each try at once (503): the exit report is retried until it is
    taken (here after 150 quick refusals), not given up after a count of tries."""
    outage = DatabaseOutage()
    try:
        reporter = Reporter(Client(outage.url, "node-token", timeout=5), patience=30, retry_every=0.01,
                            least_flush=0.0, exit_patience=120)
        done = threading.Event()
        threading.Thread(target=lambda: (reporter.report_exit("succeeded", 0, None), done.set()),
                         daemon=True).start()
        eventually(lambda: sum(path == "/v1/agent/exit" for path, _ in outage.arrived) >= 150,
                   "150 refused tries of the exit report", timeout=120, every=0.05)
        assert not done.is_set()  # still trying
        outage.back.set()
        assert done.wait(120), "the exit report was given up"
        assert outage.exited
    finally:
        outage.server.shutdown()
        outage.server.server_close()
