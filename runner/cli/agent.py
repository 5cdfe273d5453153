"""`runner agent` (the on-node daemon) and `runner agent watch` (a smoke test on a real VM)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default="/etc/runner/agent.yaml", show_default=True)
@click.pass_context
def agent(ctx, config_path: Path):
    """Run the on-node agent: run the job, stream its output, watch for preemption.

    With `mode: sidecar` in the config it runs no job: it serves the control socket to a training process
    started beside it (a pod's training container) and asks it for checkpoints on preemption notices.
    """
    if ctx.invoked_subcommand is not None:
        return
    from agents.entry import run_agent

    raise SystemExit(run_agent(config_path))


@agent.command()
@click.option("--cloud", type=click.Choice(["aws", "gcp", "azure"]), help="Default: detect.")
def watch(cloud: str | None):
    """Print one JSON line per preemption notice; exit 0 after the first terminal one."""
    from agents.watchers.watch import watch as run_watch

    raise SystemExit(run_watch(cloud))
