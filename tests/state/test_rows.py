"""The typed rows (runner/state/rows.py): each class knows every column of its table, in order, and builds
itself from a row with each field from its own column, typed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runner.state import open_database
from runner.state.rows import Attempt, AttemptNode, Event, Job, Node

SQLITE_ONLY = "the table's columns are read with SQLite's PRAGMA table_info (the schema is the same on both)"
ROWS = {"jobs": Job, "attempts": Attempt, "attempt_nodes": AttemptNode, "nodes": Node, "events": Event}
JSON_COLUMNS = {"spec", "checkpoint", "notice", "drill", "offer", "progress", "standby", "world_sizes"}
# The JSON columns whose value has a type of its own (runner/spec/stored.py, runner/state/values.py): each holds
# what a controller writes there, and comes back as its type, which turns into the same JSON again.
TYPED = {"spec": {"name": "job", "workdir": ".", "setup": None, "run": "true", "env": {"A": "1"},
                  "resources": {"cloud": None, "accelerators": "T4:1", "cpus": None, "memory_gb": None,
                                "regions": None, "spot_policy": "spot", "max_price_per_hour": None, "num_nodes": 1,
                                "min_nodes": None},
                  "checkpoint": {"local_dir": None, "durable_url": None, "interval": "auto", "keep": 3},
                  "recovery": {"max_preemptions": 50, "max_failures": 2, "resume_drill": "10m", "deadline": None,
                               "total_steps": None, "prepare_on": ["notice"], "standby_timeout": "10m"},
                  "workdir_digest": None},
         "offer": {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "g4dn.xlarge",
                   "accelerator": "T4", "accelerator_count": 1, "cpus": 4, "memory_gb": 16.0, "spot_price": 0.2,
                   "on_demand_price": 0.526},
         "notice": {"source": "aws", "kind": "termination", "action": "terminate",
                    "received_at": "2026-11-23T10:00:00Z", "deadline": "2026-11-23T10:02:00Z", "terminal": True,
                    "id": "aws:termination", "node_rank": 1, "column": "notice"}}


def _columns(tmp_path, table: str) -> list[tuple[str, str]]:
    db = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    return [(c["name"], c["type"]) for c in db.query(f"PRAGMA table_info({table})")]


def _distinct_row(columns: list[tuple[str, str]]) -> dict:
    """A row whose every column holds a value of its type that no other column holds."""
    row = {}
    for i, (name, kind) in enumerate(columns, start=1):
        if name in TYPED:
            row[name] = json.dumps(TYPED[name])
        elif name in JSON_COLUMNS:
            row[name] = json.dumps({"column": name, "resources": {}})
        elif kind == "TEXT":
            row[name] = f"{name}-value"
        elif kind == "REAL":
            row[name] = 1000 + i + 0.5
        else:
            row[name] = 1000 + i
    return row


@pytest.mark.parametrize("table", sorted(ROWS))
def test_each_field_comes_from_its_own_column_and_every_column_is_known(tmp_path, table):
    """A migration that adds a column fails here until the row class has it, in the table's order."""
    cls, columns = ROWS[table], _columns(tmp_path, table)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "nodes"]
    assert names == [name for name, _ in columns]
    row = _distinct_row(columns)
    typed = cls.from_row(row)
    declared = {f.name: f.type.split(" ")[0] for f in dataclasses.fields(cls)}  # "float | None" -> "float"
    for name, _ in columns:
        value = getattr(typed, name)
        if name in TYPED:
            assert value.to_json() == TYPED[name] and list(value.to_json()) == list(TYPED[name]), name
        elif name in JSON_COLUMNS:
            assert value == {"column": name, "resources": {}}, name
        elif declared[name] == "bool":
            assert value is True, name
        else:
            assert value == row[name] and type(value).__name__ == declared[name], name


def test_a_column_the_row_does_not_know_is_ignored(tmp_path):
    """A database migrated by a newer runner of the same schema version family can have more columns."""
    row = {**_distinct_row(_columns(tmp_path, "nodes")), "added_by_a_later_migration": "x"}
    assert Node.from_row(row).id == "id-value"


def test_null_and_never_become_none_and_whole_numbers_in_real_columns_floats(tmp_path):
    """``cancel_requested`` 0 is "never": None; an integer in a REAL column (as Postgres may return one) a float."""
    row = {**_distinct_row(_columns(tmp_path, "jobs")), "cancel_requested": 0, "created_at": 1000,
           "ended_at": None, "checkpoint": None}
    job = Job.from_row(row)
    assert job.cancel_requested is None and job.ended_at is None and job.checkpoint is None
    assert isinstance(job.created_at, float)
    assert Job.from_row({**row, "cancel_requested": 1763900000}).cancel_requested == 1763900000.0


def test_rows_are_frozen_and_a_changed_copy_is_made_with_replace(tmp_path):
    node = Node.from_row(_distinct_row(_columns(tmp_path, "nodes")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.state = "terminated"  # type: ignore[misc]
    assert dataclasses.replace(node, state="terminated").state == "terminated" and node.state == "state-value"
