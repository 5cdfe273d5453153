"""The controller's tests run on SQLite and on Postgres by default (tests/conftest.py): a test module there that opens
a SQLite store or starts a controller of its own, past the `db_url` and `controller` fixtures, says why it stays on
SQLite (``SQLITE_ONLY = "why"`` or ``@pytest.mark.sqlite_only("why")``) instead of quietly skipping Postgres."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ON_BOTH_DATABASES_IN, TESTS

# A SQLite URL written out, or a controller started without saying its database.
OWN_SQLITE = re.compile(r"sqlite:///|\bController\((?![^)]*db_url)[^)]*\)")
DECLARED = re.compile(r"^SQLITE_ONLY = |@pytest\.mark\.sqlite_only\(", re.M)


def test_every_module_that_stays_on_sqlite_says_why():
    quiet = []
    for folder in ON_BOTH_DATABASES_IN:
        for module in sorted((TESTS / folder).glob("test_*.py")):
            text = module.read_text()
            if OWN_SQLITE.search(text) and not DECLARED.search(text):
                quiet.append(str(module.relative_to(TESTS)))
    assert quiet == [], f"these open SQLite themselves without SQLITE_ONLY: {quiet}"


def test_the_check_sees_a_store_or_a_controller_of_its_own(tmp_path: Path):
    assert OWN_SQLITE.search("store = Store(open_database(f\"sqlite:///{tmp_path / 'runner.db'}\"))")
    assert OWN_SQLITE.search("ctl = Controller(home).start()")
    assert not OWN_SQLITE.search("ctl = Controller(home, db_url=module_controller_db).start()")
    assert DECLARED.search('import x\nSQLITE_ONLY = "a pragma"\n')
