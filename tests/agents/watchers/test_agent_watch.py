"""`runner agent watch`: one JSON line per notice, exit 0 after the first terminal notice."""

import io
import json
import threading

from agents.watchers import watch
from runner.providers.local.metadata import inject_notice, serve_all


def run_watch(cloud, env, inject):
    out = io.StringIO()
    threading.Timer(0.3, inject).start()
    stop = threading.Event()
    safety = threading.Timer(10, stop.set)  # never hang the test run
    safety.start()
    code = watch(cloud, out, env=env, stop=stop)
    safety.cancel()
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_aws_preemption_prints_the_termination_and_exits_0():
    """A spot preemption on AWS prints its notices as JSON lines and ends the watch with 0."""
    with serve_all(clouds=("aws",)) as node:
        code, lines = run_watch("aws", node.environment(),
                                lambda: inject_notice("aws", node.endpoints()["aws"], 120))
    assert code == 0
    assert lines[-1]["source"] == "aws" and lines[-1]["action"] == "terminate"
    assert {"source", "kind", "action", "deadline"} <= set(lines[-1]) and lines[-1]["deadline"].endswith("Z")


def test_detected_gcp_preemption_exits_0():
    """Without --cloud, the cloud comes from the endpoint variables; a GCP preemption ends the watch."""
    with serve_all(clouds=("gcp",)) as node:
        code, lines = run_watch(None, node.environment(),
                                lambda: inject_notice("gcp", node.endpoints()["gcp"], 30))
    assert code == 0 and [(l["source"], l["kind"], l["action"]) for l in lines] == [("gcp", "termination", "preempt")]


def test_azure_preemption_exits_0():
    """An Azure Preempt event ends the watch with 0."""
    with serve_all(clouds=("azure",)) as node:
        code, lines = run_watch("azure", node.environment(),
                                lambda: inject_notice("azure", node.endpoints()["azure"], 30))
    assert code == 0 and lines[-1]["action"] == "preempt"


def test_unknown_cloud_is_bad_input(capsys):
    """--cloud with an unknown name exits 2 with the choices."""
    assert watch("oracle", io.StringIO(), env={}) == 2
    assert "aws, gcp, azure" in capsys.readouterr().err


def test_stop_before_any_notice_exits_130():
    """Interrupted before a terminal notice, the watch exits 130 (as after Ctrl-C)."""
    stop = threading.Event()
    stop.set()
    with serve_all(clouds=("azure",)) as node:
        assert watch("azure", io.StringIO(), env=node.environment(), stop=stop) == 130
