"""Fixtures, imported by the tests here. End-to-end runs use a less compressed clock than the unit-level controller tests.

At the root conftest's time scale (0.05) a simulated Azure node gets 1.5 s between its notice and its
power-off; a 1 s poll and Scheduled Events' whole-second NotBefore can leave the job almost nothing of
that, which tests a pathological notice rather than a preemption. At 0.2 every cloud leaves at least 6 s
(AWS 24 s). The tests never wait for the grace to run out: the attempt ends when the job exits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import kill_nodes


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    yield path
    kill_nodes(path)
