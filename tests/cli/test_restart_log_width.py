"""`runner restarts JOB` fits the terminal: at 80 and 120 columns no line is longer, and what a row says about
recovery (attempt, zone, why it ended, the notice, the steps saved and resumed, the work lost, the cost, the
drill) reads whole. `--wide` adds the other columns."""

from __future__ import annotations

import pytest

from runner.cli.jobs import print_restart_log


def _row(attempt: int, **fields) -> dict:
    row = {"attempt": attempt, "node": f"local-b-{attempt}", "cloud": "aws", "region": "us-east-1",
           "zone": "us-east-1a", "instance_type": "p4d.24xlarge", "spot": True, "price_per_hour": 12.3456,
           "started_at": "2026-11-21T10:00:00Z", "ended_at": "2026-11-21T10:09:12Z", "end_reason": "preempted",
           "notice": {"source": "aws", "action": "terminate"}, "checkpoint_step": 123400,
           "resumed_from_step": 118000, "lost_seconds": 0.4, "cost_usd": 12.3456, "exit_code": 143,
           "message": "the job was preempted; relaunching from the last committed checkpoint",
           "steps": 5400, "peak_memory_gb": 61.25, "nan_steps": 0}
    return {**row, **fields}


ROWS = [_row(1, end_reason="drill", notice=None, drill={"passed": True, "checkpoint_step": 300}, resumed_from_step=0),
        _row(2), _row(3, end_reason="running", ended_at=None, notice=None, checkpoint_step=None, lost_seconds=None)]
GANG = [_row(1, nodes=[{"rank": 0, "end_reason": "kept"}, {"rank": 1, "end_reason": "preempted"},
                       {"rank": 2, "end_reason": "kept"}, {"rank": 3, "end_reason": "kept"}],
             notice={"source": "aws", "node_rank": 1})]


def _printed(capsys, monkeypatch, columns: int, rows: list[dict], wide: bool = False) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    print_restart_log(rows, wide=wide)
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("columns", [80, 120])
def test_the_restart_log_fits_the_terminal_and_its_key_fields_read_whole(capsys, monkeypatch, columns):
    lines = _printed(capsys, monkeypatch, columns, ROWS)
    assert all(len(line) <= columns for line in lines), "\n".join(lines)
    header, drill, preempted, running = lines[:4]
    for name in ("#", "WHERE", "REASON", "NOTICE", "SAVED", "RESUMED", "LOST", "COST", "DRILL"):
        assert name in header.split()
    assert drill.split()[:3] == ["1", "us-east-1a", "p4d.24xlarge"] and "drill" in drill and "passed" in drill
    assert {"preempted", "aws", "123400", "118000", "0.4s", "$12.35"} <= set(preempted.split())
    assert "running" in running.split()
    assert "--wide" in lines[-1]


def test_a_gang_s_nodes_wrap_within_80_columns(capsys, monkeypatch):
    lines = _printed(capsys, monkeypatch, 80, GANG)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = " ".join(lines)
    for part in ("us-east-1a", "p4d.24xlarge", "preempted", "aws", "0:kept", "1:preempted", "2:kept", "3:kept"):
        assert part in text.split()


def test_wide_shows_every_column(capsys, monkeypatch):
    lines = _printed(capsys, monkeypatch, 250, ROWS, wide=True)
    for name in ("PRICE/H", "STARTED", "ENDED", "EXIT", "STEPS", "PEAK", "NAN"):
        assert name in lines[0]
    assert {"143", "5400", "10:09:12Z", "61.25"} <= set(lines[2].split())
    assert "--wide" not in lines[-1]
