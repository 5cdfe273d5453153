"""A local market as slow as a cloud (clouds.local.boot_seconds), and the job's `setup` once per new node.

Timings are asserted as the order of recorded timestamps (a node registers no earlier than its boot after its
launch), never as a wall-clock budget.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from runner.providers.local.processes import ref_alive
from runner.state import Store, open_database
from runner.state.store import LIVE_NODE_STATES, NODE_TERMINATED

BOOT_SECONDS = 2.0
NODE_STATES = (*LIVE_NODE_STATES, NODE_TERMINATED)
JOB = """
name: slow-boot
setup: pwd >> "$SETUP_LOG"
run: sleep 600
env: {{SETUP_LOG: "{log}"}}
resources: {{cloud: [local], num_nodes: {nodes}}}
recovery: {{max_preemptions: 3, resume_drill: "off"}}
"""


@pytest.fixture
def slow_market(tmp_path: Path):
    """A controller whose local nodes take BOOT_SECONDS to boot (notices on the 0.05 time scale)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(
        {"clouds": {"local": {"time_scale": 0.05, "boot_seconds": BOOT_SECONDS}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    store = Store(open_database(f"sqlite:///{home / 'runner.db'}"))
    try:
        yield runner, store, home
    finally:
        controller.stop()
        kill_nodes(home)
        store.db.close()


def _nodes(store: Store, job_id: str) -> list:
    return store.nodes(NODE_STATES, job_id=job_id)


def _wait_for_nodes(store: Store, job_id: str, ready, what: str, timeout: float = 180.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = _nodes(store, job_id)
        if ready(nodes):
            return nodes
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; nodes: {_nodes(store, job_id)}")


def _set_up(node) -> bool:
    return node.setup_ended_at is not None


def _setup_runs(log: Path) -> list[str]:
    """The node of each run of the job's setup (its workdir is under nodes/NODE_ID/)."""
    return [Path(line).parts[-3] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_booting_node_registers_after_its_boot_and_a_relaunched_node_runs_setup_again(slow_market, tmp_path):
    """Launch, boot, registration, setup, in that order on the recorded times; after a preemption the
    replacement node boots and runs `setup` again before `run`."""
    runner, store, _ = slow_market
    log = tmp_path / "setup.log"
    job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB.format(log=log, nodes=1))))["id"]
    first, = _wait_for_nodes(store, job_id, lambda ns: len(ns) == 1 and _set_up(ns[0]), "the first node's setup")
    assert first.launched_at is not None and first.first_registered_at is not None
    assert first.first_registered_at - first.launched_at >= BOOT_SECONDS
    assert first.boot_seconds >= BOOT_SECONDS
    assert first.first_registered_at <= first.setup_started_at <= first.setup_ended_at
    assert first.setup_seconds is not None and first.setup_seconds >= 0
    runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="attempt 1 running")

    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    nodes = _wait_for_nodes(store, job_id, lambda ns: len(ns) == 2 and all(_set_up(n) for n in ns),
                            "the replacement node's setup")
    second = next(n for n in nodes if n.id != first.id)
    assert second.first_registered_at - second.launched_at >= BOOT_SECONDS
    assert second.first_registered_at <= second.setup_started_at <= second.setup_ended_at
    assert _setup_runs(log) == [first.id, second.id]
    assert runner.json("status", job_id)["attempts"] == 2


def test_a_kept_gang_node_does_not_run_setup_again_but_its_replaced_peer_does(slow_market, tmp_path):
    """A 2-node gang loses node 1: node 0 carries on into the next attempt without a second setup, the
    replacement of node 1 runs setup once."""
    runner, store, _ = slow_market
    log = tmp_path / "setup.log"
    job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB.format(log=log, nodes=2))))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", timeout=180, what="the gang running")
    before = {n.rank: n for n in _wait_for_nodes(store, job_id, lambda ns: len(ns) == 2 and all(map(_set_up, ns)),
                                                 "both nodes' setup")}
    assert runner("preempt", job_id, "--node", "1", "--notice", "aws").returncode == 0
    runner.wait_for(job_id, lambda j: j["attempts"] == 2 and j["state"] == "RUNNING", timeout=180,
                    what="the gang's next attempt running")
    nodes = _wait_for_nodes(store, job_id, lambda ns: len(ns) == 3 and all(map(_set_up, ns)), "the replacement's setup")
    replacement = next(n for n in nodes if n.id not in {b.id for b in before.values()})
    kept = next(n for n in nodes if n.id == before[0].id)
    assert kept.attempt == 2 and kept.setup_started_at == before[0].setup_started_at  # no second setup
    assert sorted(_setup_runs(log)) == sorted([before[0].id, before[1].id, replacement.id])
    assert replacement.first_registered_at - replacement.launched_at >= BOOT_SECONDS


def test_a_node_cancelled_while_it_boots_is_gone_and_never_registers(tmp_path):
    """A terminate during the boot kills the node's whole process session; its agent never starts."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05, "boot_seconds": 600}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB.format(log=tmp_path / "x", nodes=1))))["id"]
        deadline = time.monotonic() + 60
        while not list(home.glob("nodes/*/ref")) and time.monotonic() < deadline:
            time.sleep(0.1)
        ref_file, = home.glob("nodes/*/ref")
        ref = ref_file.read_text()
        assert ref_alive(ref)
        assert runner.json("status", job_id)["state"] == "PROVISIONING"  # the controller answers meanwhile
        assert runner("cancel", job_id).returncode == 0
        runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", what="cancelled")
        deadline = time.monotonic() + 60
        while ref_alive(ref) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not ref_alive(ref)
        store = Store(open_database(f"sqlite:///{home / 'runner.db'}"))
        node, = store.nodes(NODE_STATES, job_id=job_id)
        store.db.close()
        assert node.first_registered_at is None and node.setup_started_at is None
    finally:
        controller.stop()
        kill_nodes(home)


def test_a_local_job_checkpoints_through_its_nodes_share_of_the_durable_bandwidth(tmp_path):
    """With clouds.local.durable_mb_per_s, a local job's default durable tier is local-durable:// under the
    controller's data dir, and the job's processes get the node's bandwidth."""
    from runner.local_durable import BUCKET_VARIABLE, RATE_VARIABLE

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05,
                                                                           "durable_mb_per_s": 50}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job = write_job(tmp_path / "job", f"""
name: throttled
run: echo "url=$RUNNER_CHECKPOINT_URL rate=${RATE_VARIABLE} bucket=${BUCKET_VARIABLE}"
resources: {{cloud: [local]}}
recovery: {{resume_drill: "off"}}
""")
        job_id = runner.json("submit", str(job))["id"]
        runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", what="the job's end")
        output = runner.output(job_id)
        url = f"local-durable://{(home / 'checkpoints' / job_id).resolve()}"
        node_dir, = home.glob("nodes/*")
        assert f"url={url} rate=50.0 bucket={node_dir.resolve() / 'durable-bandwidth'}" in output \
            or f"url={url} rate=50.0 bucket={node_dir / 'durable-bandwidth'}" in output, output
    finally:
        controller.stop()
        kill_nodes(home)


def test_a_new_node_of_a_job_without_setup_reports_a_setup_of_0_seconds(tmp_path):
    """setup_seconds is 0, not unknown, on a node whose job has no setup: the node is ready once registered."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.05}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    store = Store(open_database(f"sqlite:///{home / 'runner.db'}"))
    try:
        job = write_job(tmp_path / "job", 'name: no-setup\nrun: sleep 600\nrecovery: {resume_drill: "off"}\n')
        job_id = runner.json("submit", str(job))["id"]
        node, = _wait_for_nodes(store, job_id, lambda ns: len(ns) == 1 and _set_up(ns[0]), "the setup report")
        assert node.setup_seconds == 0 and node.first_registered_at <= node.setup_started_at
        assert node.boot_seconds is not None and node.boot_seconds >= 0
    finally:
        controller.stop()
        kill_nodes(home)
        store.db.close()
