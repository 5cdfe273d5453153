"""The `runner` entry point: commands are registered here; errors are caught once, here."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from ..client import ClientError
from ..errors import InputError
from .pipes import OutputClosed, closed_output_ends_the_command, output_closed

# Each command's module is imported only when that command runs: `runner agent` on a node and every quick
# `runner status` start without the job-file schema, the tables and the simulator they do not use.
COMMANDS = {
    "submit": "jobs:submit", "validate": "jobs:validate", "jobs": "jobs:list_jobs", "status": "jobs:status",
    "logs": "jobs:logs", "restarts": "jobs:restarts", "cancel": "jobs:cancel", "preempt": "jobs:preempt",
    "offers": "offers:offers", "server": "server:server", "agent": "agent:agent", "simulate": "simulate:simulate",
    "dashboard": "dashboard:dashboard",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), attr)

    # A closed output while parsing (`--help`, `--version`) or running a command: main() ends it (click's own catch of
    # an EPIPE would exit 1).
    def make_context(self, *args, **kwargs):
        with closed_output_ends_the_command():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with closed_output_ends_the_command():
            return super().invoke(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="runner")
def cli(debug: bool):
    """Fault-tolerant GPU training on spot instances."""
    if debug:
        os.environ["RUNNER_DEBUG"] = "1"


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered: a reader that has gone shows here, not as the interpreter exits
        return code
    except BrokenPipeError:  # (an error's message written to a closed stderr)
        return output_closed()


def _run(argv: list[str] | None) -> int:
    debug = "--debug" in (argv or sys.argv) or os.environ.get("RUNNER_DEBUG") == "1"
    try:
        cli.main(args=argv, prog_name="runner", standalone_mode=False)
    except (OutputClosed, BrokenPipeError):  # `runner jobs | head -1`: no message, exit 141 (pipes.py)
        return output_closed()
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return 2
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    except ClientError as exc:
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except InputError as exc:  # a job file, config.yaml, an argument: the message names the key and the fix
        click.echo(f"error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one catch-all: a plain line, the traceback only with --debug
        if debug:
            traceback.print_exc()
        message = _known_error(exc)
        click.echo(f"error: {message}" + ("" if debug else " (run with --debug for details)"), err=True)
        return 1
    return 0


def _known_error(exc: Exception) -> str:
    from ..controller.daemon import ServerError
    from ..state import DatabaseError

    if isinstance(exc, (ServerError, DatabaseError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
