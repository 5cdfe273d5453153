"""A throwaway Postgres cluster for the test session: Debian's initdb and pg_ctl in a temporary folder.

initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` system user (commands run
through ``runuser``); as anyone else it belongs to the current user. The superuser has a password, so the
tests use real password URLs (and can check that the password never shows).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "runner"
PASSWORD = "pw-" + secrets.token_hex(8)
PREFIX = "runner-pg-"
OWNER_FILE = "owner"  # the pid of the test process whose server it is


def find_binaries() -> Path | None:
    """The bin folder of the newest Postgres installed the Debian way, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """``durable``: Postgres's own defaults (fsync, synchronous commit, full page writes), as a production server
    runs: for benchmarks/controller_scale.py. The tests turn them off: nothing they keep must survive a crash."""

    def __init__(self, bin_dir: Path, durable: bool = False):
        self.bin_dir = bin_dir
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.data = self.root / "data"
        self.port = free_port()
        self._as = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._counter = 0
        self._template: str | None = None
        self._admin_conn = None

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> "PostgresServer":
        self._stop_abandoned()
        (self.root / OWNER_FILE).write_text(str(os.getpid()))
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as:
            shutil.chown(pwfile, "postgres")
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile),
                  "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        # Each pytest-xdist worker starts its own server (own folder, own socket dir): a port another worker took
        # between free_port() and the server's bind fails the start, so it tries again on a new one.
        for attempt in range(3):
            options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=300"
                       + ("" if self.durable else " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"))
            try:
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                          str(self.root / "server.log"), "-w", "-t", "60", "start")
                return self
            except subprocess.CalledProcessError:
                if attempt == 2 or "could not bind" not in self.log():
                    raise
                self.port = free_port()

    def _stop_abandoned(self) -> None:
        """Stop the servers of test processes that died without stopping theirs (a killed pytest cannot)."""
        for root in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
            try:
                owner = int((root / OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue  # not one of ours, or still starting
            if _alive(owner):
                continue
            subprocess.run([*self._as, str(self.bin_dir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate",
                            "-w", "stop"], capture_output=True, timeout=60)
            shutil.rmtree(root, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self._admin_conn is not None:
            self._admin_conn.close()
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", password: str = PASSWORD, port: int | None = None) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{port or self.port}/{database}"

    def new_database(self, migrated: bool = False) -> str:
        """A fresh database; its URL. Empty, or ``migrated`` to this runner's schema: a copy of a template
        database migrated once per session (copying is cheaper than applying every migration each time)."""
        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}"
        template = f' TEMPLATE "{self._migrated_template()}"' if migrated else ""
        self._admin(f'CREATE DATABASE "{name}"{template}')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database made by :meth:`new_database`, ending the sessions still connected to it."""
        name = url.rsplit("/", 1)[1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        """Run ``sql`` on one kept connection (every test creates and drops a database: no new login each time);
        a connection that a test's session kill took down is replaced once."""
        import psycopg

        for attempt in range(2):
            if self._admin_conn is None or self._admin_conn.closed:
                self._admin_conn = psycopg.connect(self.url(), autocommit=True)
            try:
                self._admin_conn.execute(sql)
                return
            except psycopg.OperationalError:
                self._admin_conn.close()
                if attempt:
                    raise

    def _migrated_template(self) -> str:
        if self._template is None:
            from runner.state import open_database

            url = self.new_database()
            open_database(url).close()  # no session may stay on a template that is being copied
            self._template = url.rsplit("/", 1)[1]
        return self._template


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
