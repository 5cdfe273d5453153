"""`runner simulate` and the deadline keys of `runner validate`: output, and bad input refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli.main import main

SHARED = Path(__file__).resolve().parents[2] / "data" / "traces"  # the traces the repository ships
JOB = "name: tiny\nrun: python train.py\nresources: {spot_policy: auto}\n"


def trace(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)


def good(gap: int = 600, ticks: int = 300) -> str:
    return json.dumps({"metadata": {"gap_seconds": gap}, "data": [1] * ticks})


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_simulate_json_lists_every_policy(runner):
    """The real command: one object per policy with the contract's keys."""
    result = runner("simulate", "--traces", str(SHARED / "preemption-4node-aws-08-03-2023"), "--starts", "3",
                    "--job-hours", "10", "--deadline-hours", "14", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["policy"] for r in rows] == ["on-demand", "spot", "uniform-progress", "runner"]
    assert all(set(r) == {"policy", "mean_cost_usd", "vs_on_demand", "deadline_met_fraction", "runs"} for r in rows)
    assert rows[0]["vs_on_demand"] == 1.0 and rows[-1]["deadline_met_fraction"] == 1.0
    assert rows[0]["mean_cost_usd"] == pytest.approx((10 + 5 / 60) * 3.06, abs=0.01)  # the default prices, restart


def test_simulate_prints_a_table(capsys):
    assert main(["simulate", "--traces", str(SHARED / "preemption-4node-aws-08-03-2023"), "--starts", "2",
                 "--spot-price", "1", "--on-demand-price", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["POLICY", "MEAN", "COST", "VS", "ON-DEMAND", "DEADLINE", "MET", "RUNS"]
    assert lines[1].split()[:3] == ["on-demand", "$72.25", "100%"]  # (24 h + 5 min) x $3


def test_traces_of_mixed_tick_lengths_are_named(tmp_path, capsys):
    trace(tmp_path / "t", "a.json", good(gap=600))
    trace(tmp_path / "t", "b.json", good(gap=300))
    err = refused(capsys, "simulate", "--traces", str(tmp_path / "t"))
    assert "different tick lengths (a.json 600s, b.json 300s)" in err


@pytest.mark.parametrize("text, says", [
    ("", "b.json: the file is empty"),
    ("{not json", "b.json: not valid JSON (line 1"),
    ('{"data": [1, 0]}', "b.json: expected an object with metadata.gap_seconds and data"),
    ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "b.json: metadata.gap_seconds must be a positive number"),
    ('{"metadata": {"gap_seconds": 600}, "data": []}', "b.json: data must be a non-empty list"),
    ('{"metadata": {"gap_seconds": 600}, "data": [1, -1]}', "b.json: data[1] is -1"),
])
def test_an_empty_or_malformed_trace_file_is_named(tmp_path, capsys, text, says):
    trace(tmp_path / "t", "a.json", good())
    trace(tmp_path / "t", "b.json", text)
    assert says in refused(capsys, "simulate", "--traces", str(tmp_path / "t"))


def test_a_folder_without_traces_and_a_missing_folder_are_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "no .json trace files in it" in refused(capsys, "simulate", "--traces", str(tmp_path / "empty"))
    assert "not a folder" in refused(capsys, "simulate", "--traces", str(tmp_path / "nowhere"))


def test_a_deadline_beyond_the_traces_or_before_the_work_is_named(tmp_path, capsys):
    trace(tmp_path / "t", "a.json", good(ticks=300))  # 50 h
    err = refused(capsys, "simulate", "--traces", str(tmp_path / "t"), "--deadline-hours", "60")
    assert "--deadline-hours 60: the traces cover only 50.0 h" in err
    err = refused(capsys, "simulate", "--traces", str(tmp_path / "t"), "--job-hours", "30", "--deadline-hours", "30")
    assert "--deadline-hours 30: even all on-demand, the job needs 30.0833 h" in err


def test_a_deadline_in_the_past_is_refused_naming_the_earliest_on_demand_finish(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "recovery: {deadline: '2020-01-01T00:00:00Z', total_steps: 1000}\n")
    err = refused(capsys, "validate", str(job))
    assert "recovery.deadline: 2020-01-01T00:00:00Z is in the past; even all on-demand, the earliest finish " \
           "is after a 2m launch, at " in err


def test_a_deadline_closer_than_a_launch_is_refused(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "recovery: {deadline: 90s, total_steps: 1000}\n")
    assert "recovery.deadline: " in refused(capsys, "validate", str(job))


def test_a_deadline_without_total_steps_names_the_key(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "recovery: {deadline: 36h}\n")
    assert "recovery.total_steps: required with recovery.deadline" in refused(capsys, "validate", str(job))


@pytest.mark.parametrize("value, says", [
    ("tomorrow", "'tomorrow' is neither a duration (36h) nor an RFC 3339 time"),
    ("'2030-01-01T00:00:00'", "has no time zone"),
    ("0h", "must be a positive duration"),
])
def test_a_malformed_deadline_names_the_key(tmp_path, capsys, value, says):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + f"recovery: {{deadline: {value}, total_steps: 10}}\n")
    err = refused(capsys, "validate", str(job))
    assert "recovery.deadline" in err and says in err


def test_a_good_deadline_validates(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "recovery: {deadline: 36h, total_steps: 20000}\n")
    assert main(["validate", str(job)]) == 0
    job.write_text(JOB + "recovery: {deadline: 2099-01-01T00:00:00Z, total_steps: 20000}\n")  # YAML reads a datetime
    assert main(["validate", str(job)]) == 0


def test_simulate_takes_node_types_and_a_gang(capsys):
    """--throughput TYPE=STEPS_PER_S with a TYPE=PRICE per type, and --nodes: the table adds launches by type."""
    assert main(["simulate", "--traces", str(SHARED / "availability-16node-aws-2023-08-27"), "--starts", "3",
                 "--nodes", "4", "--throughput", "slow=1", "--throughput", "fast=4", "--spot-price", "slow=1",
                 "--spot-price", "fast=3", "--on-demand-price", "slow=3", "--on-demand-price", "fast=9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-3:] == ["LAUNCHES", "BY", "TYPE"]
    assert lines[1].split()[:3] == ["on-demand", "$219.00", "100%"]  # (6 h of work on fast + 5 min) x 4 nodes x $9


@pytest.mark.parametrize("argv, says", [
    (["--throughput", "fast=4"], "--spot-price: give TYPE=PRICE for each --throughput type"),
    (["--throughput", "fast", "--spot-price", "fast=1", "--on-demand-price", "fast=3"], "--throughput fast: use TYPE=NUMBER"),
    (["--throughput", "fast=0", "--spot-price", "fast=1", "--on-demand-price", "fast=3"], "must be a positive number"),
    (["--spot-price", "fast=1"], "--spot-price fast=1: give one price"),
    (["--nodes", "20"], "--nodes 20: no zone of"),
    (["--nodes", "0"], "--nodes 0: must be a whole number of at least 1"),
])
def test_bad_types_and_gang_sizes_are_named(capsys, argv, says):
    err = refused(capsys, "simulate", "--traces", str(SHARED / "availability-16node-aws-2023-08-27"), *argv)
    assert says in err, err
