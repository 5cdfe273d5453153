"""The leader is SIGKILLed while a notice is trained through, its replacement booting: the next leader carries the
pending handover on. Two controllers on one Postgres (as test_failover.py sets them up), the local market's
clock at 0.2 (AWS's notice leaves 24 s). The replacement's setup waits until the first attempt has ended (an
event, not a time), so the old node trains on to its deadline, holds at a durable checkpoint and is reclaimed,
all under the new leader; the replacement then takes the next attempt from exactly that step, its boot and setup
in that attempt's ledger and its time billed from its launch."""

from __future__ import annotations

import time
from datetime import datetime

import psycopg
import pytest
import yaml

from trained_through_job import STEP, TRAINEE
from conftest import kill_nodes, write_job
from test_failover import Team, cli_for



def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.timeout(900)
def test_a_leader_killed_while_the_replacement_boots_leaves_the_handover_to_the_next(tmp_path, postgres):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    team = Team(home, postgres.new_database(), size=2)
    try:
        cli = cli_for(team)
        marker, go = tmp_path / "first-setup-done", tmp_path / "replacement-may-finish-setup"
        setup = f"if [ -e {marker} ]; then while [ ! -e {go} ]; do sleep 0.1; done; else touch {marker}; fi"
        text = (f"name: leader-dies\nsetup: {setup!r}\nrun: python train.py 300\nresources: {{cloud: [local]}}\n"
                "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")
        job_id = cli.json("submit", str(write_job(tmp_path / "job", text, {"train.py": TRAINEE})))["id"]
        cli.wait_for_output(job_id, r"^step 30 at ", timeout=300)
        assert cli("preempt", job_id, "--notice", "aws").returncode == 0

        def replacement_launched(job) -> bool:  # on the first attempt's row: on a busy node its timer may have
            # handed over already (the next attempt then starts on the replacement, still in its setup)
            return bool((cli.json("restarts", job_id)[0].get("standby") or {}).get("node"))

        cli.wait_for(job_id, replacement_launched, timeout=120, what="the replacement's launch")
        team.kill_leader_and_time_takeover()
        cli.wait_for(job_id, lambda j: j["preemptions"] == 1, timeout=480, what="the first attempt's end")
        go.touch()
        job = cli.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=480,
                           what="the end")

        assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1, job
        first, second = cli.json("restarts", job_id)
        standby = first["standby"]
        assert first["end_reason"] == "preempted" and standby["outcome"] == "took over", first
        assert second["node"] == standby["node"]
        trained = int(STEP.findall(cli.output(job_id, 1))[-1])
        assert first["checkpoint_step"] == second["resumed_from_step"] == trained  # nothing redone
        # The ledger of a replacement not ready by the deadline: its boot and its setup (which ended only after the
        # first attempt had) are the next attempt's, and it is billed from its launch during the notice, the old
        # node until its reclaim: paid time covers both spans (the restart log's times are whole seconds).
        launched, ended = _unix(standby["launched_at"]), _unix(first["ended_at"])
        assert second["boot_seconds"] is not None and second["setup_seconds"] is not None
        assert launched + second["boot_seconds"] + second["setup_seconds"] >= ended - 1
        both = (ended - _unix(first["started_at"])) + (_unix(job["ended_at"]) - launched)
        assert job["goodput"]["paid_seconds"] >= both - 3, job["goodput"]

        def nodes() -> list[tuple[str, str]]:
            with psycopg.connect(team.db_url) as conn:
                return conn.execute("SELECT id, state FROM nodes WHERE job_id = %s", (job_id,)).fetchall()

        assert len(nodes()) == 2, nodes()  # one replacement, however the launch was asked for again
        assert len(list(home.glob("nodes/*/ref"))) == 2  # and one simulated VM each
        deadline = time.monotonic() + 120
        while {state for _, state in nodes()} != {"terminated"}:  # and no node left running
            assert time.monotonic() < deadline, nodes()
            time.sleep(0.5)
    finally:
        team.stop()
        kill_nodes(home)
