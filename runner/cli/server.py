"""`runner server` (the controller daemon) and `runner server stop`."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import click

from ..home import runner_home
from ..logconfig import configure_logging


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8470, show_default=True, type=int, help="0 picks a free port.")
@click.option("--db", "db_url", help="Database URL (default: sqlite:///DATA_DIR/runner.db).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Default: $RUNNER_HOME.")
@click.option("--advertise-url", envvar="RUNNER_ADVERTISE_URL",
              help="URL cloud nodes use to reach this controller (default: config.yaml's server, else --host:--port).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Controller processes serving the API on --host:--port (Postgres only): the kernel spreads "
                   "connections among them, one of them leads, and one that dies is started again.")
@click.option("--worker", "as_worker", is_flag=True, hidden=True)  # internal: one of --workers N, settings on stdin
@click.pass_context
def server(ctx, host: str, port: int, db_url: str | None, data_dir: Path | None, advertise_url: str | None,
           workers: int, as_worker: bool):
    """Run the controller: HTTP API, scheduler and reconciler."""
    if ctx.invoked_subcommand is not None:
        return
    from ..controller.daemon import ServerSettings
    from ..server import serve, serve_workers, worker_settings

    if as_worker:
        settings = worker_settings(sys.stdin.buffer)
        configure_logging(settings.data_dir / "controller.jsonl", fields={"worker": settings.worker})
        with _database_errors():
            serve(settings)
        return
    data_dir = (data_dir or runner_home()).expanduser()
    configure_logging(data_dir / "controller.jsonl")
    settings = ServerSettings(data_dir=data_dir, host=host, port=port, db_url=db_url, config_home=runner_home(),
                              advertise_url=advertise_url)
    with _database_errors():
        if workers == 1:
            serve(settings)
        else:
            sys.exit(serve_workers(settings, workers))


@server.command()
@click.option("--db", "db_url", help="Database URL (default: sqlite:///DATA_DIR/runner.db).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Default: $RUNNER_HOME.")
def migrate(db_url: str | None, data_dir: Path | None):
    """Bring the database's schema up to date without starting the controller."""
    from ..controller.daemon import migrate as apply

    db_url = db_url or f"sqlite:///{(data_dir or runner_home()).expanduser().resolve() / 'runner.db'}"
    with _database_errors():
        click.echo(apply(db_url))


@contextmanager
def _database_errors():
    """A database that cannot be used: one line naming it (never its password), and the contract's exit code."""
    from ..controller.daemon import DatabaseError

    try:
        yield
    except DatabaseError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)


@server.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Default: $RUNNER_HOME.")
def stop(data_dir: Path | None):
    """Stop the local controller started for this RUNNER_HOME."""
    from ..controller.daemon import stop_running

    data_dir = (data_dir or runner_home()).expanduser()
    stopped = stop_running(data_dir)
    if stopped:
        click.echo(f"stopped the controller at {stopped['url']} (pid {stopped['pid']})")
    else:
        click.echo(f"no controller is running for {data_dir}")
