"""The HTTP client of the CLI and the agents: several controller URLs, the one that answers is used."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from postgres_server import free_port
from runner.client import Client, ControllerUnreachable


class Recording(ThreadingHTTPServer):
    """A controller stand-in on loopback that answers every request with its name, after ``delay`` seconds."""

    def __init__(self, name: str, delay: float = 0.0):
        self.name, self.delay, self.requests = name, delay, 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler):
                self.requests += 1
                time.sleep(self.delay)
                body = json.dumps({"from": self.name}).encode()
                handler.send_response(200)
                handler.send_header("content-type", "application/json")
                handler.send_header("content-length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def servers():
    started: list[Recording] = []

    def start(name: str, delay: float = 0.0) -> Recording:
        started.append(Recording(name, delay))
        return started[-1]

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def test_a_controller_that_refuses_connections_is_passed_over_and_the_answering_one_kept(servers):
    live = servers("b")
    dead = f"http://127.0.0.1:{free_port()}"
    client = Client(f"{dead}, {live.url}", "token")
    assert client.get("/v1/health") == {"from": "b"}
    assert client.url == live.url  # the next request goes straight there


def test_none_answering_is_unreachable_naming_every_url():
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(ControllerUnreachable) as raised:
        Client(",".join(urls), "token").get("/v1/health")
    assert all(url in str(raised.value) for url in urls) and raised.value.exit_code == 3


def test_a_request_that_timed_out_is_not_sent_to_another_controller(servers):
    """The slow controller may have done it: sending it elsewhere could submit a job twice."""
    slow, other = servers("slow", 2.0), servers("other")
    with pytest.raises(ControllerUnreachable, match="did not answer"):
        Client(f"{slow.url},{other.url}", "token", timeout=0.3).post("/v1/jobs", {})
    assert other.requests == 0
