"""`runner server --db` and `runner server migrate`: a database that cannot be used is one line and the
contract's exit code, never the password; migrate applies what is missing without starting a server."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest

from conftest import Controller
from postgres_server import PASSWORD
from runner.state.migrations import MIGRATIONS

NEWEST = max(version for version, _ in MIGRATIONS)


def test_migrate_applies_every_migration_once(runner, postgres):
    url = postgres.new_database()
    first = runner("server", "migrate", "--db", url)
    assert first.returncode == 0, first.stderr
    assert f"schema at version {NEWEST} (applied 1," in first.stdout
    again = runner("server", "migrate", "--db", url)
    assert again.returncode == 0 and "nothing to apply" in again.stdout
    assert PASSWORD not in first.stdout + again.stdout + first.stderr


def test_an_unreachable_postgres_exits_3_naming_host_and_port_not_the_password(runner, postgres):
    for command in (("server", "--port", "0"), ("server", "migrate")):
        result = runner(*command, "--db", "postgresql://runner:s3cret-pw@127.0.0.1:1/jobs")
        assert result.returncode == 3, result
        assert "127.0.0.1:1" in result.stderr and "s3cret-pw" not in result.stderr + result.stdout
        assert "Traceback" not in result.stderr


def test_a_wrong_password_exits_3_without_showing_it(runner, postgres):
    result = runner("server", "migrate", "--db", postgres.url(password="not-the-password-42"))
    assert result.returncode == 3
    assert f"127.0.0.1:{postgres.port}" in result.stderr and "not-the-password-42" not in result.stderr


def test_a_database_migrated_by_a_newer_runner_is_refused_naming_both_versions(runner, postgres):
    url = postgres.new_database()
    assert runner("server", "migrate", "--db", url).returncode == 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (%s, 0)", (NEWEST + 5,))
    result = runner("server", "--port", "0", "--db", url)
    assert result.returncode == 1
    assert f"schema version {NEWEST + 5}, newer than this runner's {NEWEST}" in result.stderr


def test_a_password_given_as_a_url_parameter_is_never_shown(runner, postgres, home):
    """libpq takes the password as a parameter of the URL too (`?password=...`): migrate's answer and the
    controller's log name the database without it."""
    url = urlsplit(postgres.new_database())
    as_parameter = (f"postgresql://{url.username}@{url.hostname}:{url.port}{url.path}"
                    f"?sslmode=disable&password={PASSWORD}")
    migrated = runner("server", "migrate", "--db", as_parameter)
    assert migrated.returncode == 0, migrated.stderr
    assert "password=***" in migrated.stdout and PASSWORD not in migrated.stdout + migrated.stderr
    controller = Controller(home, db_url=as_parameter).start()
    controller.stop()
    controller.process.wait(20)
    logged = (home / "controller.jsonl").read_text() + controller.process.stdout.read().decode()
    assert "controller serving" in logged and PASSWORD not in logged


@pytest.mark.parametrize("url", ["mysql://runner:s3cret-pw@127.0.0.1/jobs",
                                 "host=127.0.0.1 user=runner password=s3cret-pw dbname=jobs"])
def test_an_unsupported_database_url_is_bad_input_naming_the_supported_schemes(runner, url):
    """`--db mysql://...` (or libpq's `key=value` string) is a mistake in the command: exit 2, the supported schemes
    named, never the password."""
    for command in (("server", "--port", "0"), ("server", "migrate")):
        result = runner(*command, "--db", url)
        assert result.returncode == 2, result
        assert "sqlite:///" in result.stderr and "postgresql://" in result.stderr
        assert "s3cret-pw" not in result.stderr + result.stdout and "Traceback" not in result.stderr
