"""Controllers sharing a database tell nodes about each other: a node is launched with every live one."""

from __future__ import annotations

from runner.controller.discovery import ControllerDirectory
from runner.state import open_database
from runner.state.controllers import announce


def test_a_node_is_launched_knowing_every_live_controller_of_the_database(db_url):
    """Own URL first, then the others seen lately; one not seen for a minute is left out; a stopped one
    withdraws. A controller alone on SQLite gives its own URL only."""
    db = open_database(db_url)
    now = [1_000_000.0]
    first = ControllerDirectory(db, "http://10.0.0.1:8470", clock=lambda: now[0]).start()
    second = ControllerDirectory(db, "http://10.0.0.2:8470/", clock=lambda: now[0]).start()
    try:
        if not db.shared:
            assert first.node_urls() == "http://10.0.0.1:8470"
            return
        announce(db, "http://10.0.0.9:8470", now[0] - 3600)  # died an hour ago
        assert first.node_urls() == "http://10.0.0.1:8470,http://10.0.0.2:8470"
        assert second.node_urls() == "http://10.0.0.2:8470,http://10.0.0.1:8470"
        second.stop()
        assert first.node_urls() == "http://10.0.0.1:8470"
    finally:
        first.stop()
        second.stop()
