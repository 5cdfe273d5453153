"""The agent's reports: a checkpoint committed while the controller is down still reaches it, before the exit."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.reporter import Reporter
from runner.client import Client


class FlakyController:
    """A controller on loopback that answers 503 to the first ``failures`` event posts, and records the rest."""

    def __init__(self, failures: int):
        self.failures = failures
        self.received: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/v1/agent/events" and outer.failures > 0:
                    outer.failures -= 1
                    return self._send(503, {"detail": "restarting"})
                outer.received.append((self.path, body))
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
