"""Job commands: submit, validate, jobs, status, logs, restarts, cancel, preempt, offers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from ..client import BadRequest, ClientError, NotFound
from ..spec import format_duration
from .connect import connect
from .follow import follow_job, follow_logs
from .render import gigabytes, money, print_json, print_table, rate
from .workdir import pack_workdir


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--follow", is_flag=True, help="Stream state changes and output until the job ends.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {\"id\": ...} on one line, alone on stdout (with --follow, the job's output goes to stderr).")
def submit(job_file: Path, follow: bool, as_json: bool):
    """Validate and submit a job file; print the job id."""
    from ..spec import load_job_file  # the schema (pydantic): loaded by the commands that read a job file only

    spec = load_job_file(job_file)
    with pack_workdir(Path(spec.workdir)) as packed:  # before connecting: a workdir too big is bad input
        client = connect()
        upload = client.request("PUT", "/v1/workdirs", data=packed, headers={"content-type": "application/gzip"})
    body = spec.model_dump()
    body.pop("workdir")
    job_id = client.post("/v1/jobs", {"spec": body, "workdir_digest": upload["digest"]})["id"]
    if as_json:
        print_json({"id": job_id}, one_line=True)
    else:
        click.echo(job_id)
    if follow:
        # With --json, stdout is the one JSON document: the job's output joins the state changes on stderr.
        state = follow_job(client, job_id, output=sys.stderr if as_json else None)
        click.echo(f"[runner] job {job_id} {state}; its restart log:", err=True)
        print_restart_log(client.get(f"/v1/jobs/{job_id}/restarts"), err=True)
        raise SystemExit(0 if state == "SUCCEEDED" else 1)


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
def validate(job_file: Path):
    """Check a job file, and that a configured cloud can run it, without submitting it."""
    from ..spec import load_job_file

    spec = load_job_file(job_file)
    body = spec.model_dump()
    body.pop("workdir")
    try:  # what submit checks (the offers, a gang's zone, the tiers), by a controller that is up: none is started
        connect(start_if_needed=False).post("/v1/jobs/check", {"spec": body})
    except BadRequest:
        raise  # the controller's reason, exit 2, as submit would say it
    except ClientError as exc:
        click.echo(f"{job_file}: the file is valid (job {spec.name!r}); only the file was checked, not whether a "
                   f"configured cloud can run it ({exc})")
        return
    click.echo(f"{job_file}: valid (job {spec.name!r}), and a configured cloud can run it")


JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")  # a job's name (lowercase letters, digits, '-') and its suffix


def checked_job_id(job_id: str) -> str:
    """A job id as `runner submit` prints it. Anything else names no job, and in a URL it would reach another
    endpoint than the job's (``runner status .`` read the job listing, ``runner logs a/b`` got "Not Found")."""
    if not JOB_ID.fullmatch(job_id):
        raise NotFound(f"no job {job_id!r}: a job id is letters, digits and '-' (the job's name and a suffix, as "
                       "`runner submit` printed it); `runner jobs` lists the jobs")
    return job_id


job_id_argument = click.argument("job_id", callback=lambda ctx, param, value: checked_job_id(value))
JOB_STATES = ("PENDING", "PROVISIONING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED")
DEFAULT_LIMIT = 100


@click.command("jobs")
@click.option("--state", "states", multiple=True, type=click.Choice(JOB_STATES, case_sensitive=False),
              help="Only jobs in this state (repeat for several).")
@click.option("--limit", type=click.IntRange(min=1), help=f"At most N jobs, the newest (default {DEFAULT_LIMIT}; "
                                                          "with --all, no limit).")
@click.option("--all", "everything", is_flag=True, help="Every job, not only the active and recent ones.")
@click.option("--json", "as_json", is_flag=True)
def list_jobs(states: tuple[str, ...], limit: int | None, everything: bool, as_json: bool):
    """One row per job: by default the active jobs and those ended in the last day (the newest 100)."""
    client = connect()
    params: dict = {"state": [s.upper() for s in states]}
    if limit is not None:
        params["limit"] = limit
    if everything:
        params["all"] = "true"
    jobs = client.get("/v1/jobs", params=params)
    hidden = int(client.last_headers.get("X-Runner-Jobs-Hidden") or 0)
    if as_json:
        print_json(jobs)
    else:
        _print_jobs(jobs, filtered=bool(states) or everything)
    if hidden:
        why = ("not in " + ", ".join(s.upper() for s in states) if states else
               "past --limit" if everything else "ended over a day ago, or past --limit")
        click.echo(f"{hidden} more job(s) not shown ({why}): `runner jobs --all` lists every job, "
                   "`--state STATE` only those in a state, `--limit N` more of them.", err=True)


def _print_jobs(jobs: list[dict], filtered: bool) -> None:
    print_table(
        ["ID", "NAME", "STATE", "ATTEMPTS", "PREEMPTIONS", "STEP", "COST", "STEPS/S", "$/1K STEPS", "AGE"],
        [[j["id"], j["name"], j["state"], j["attempts"], j["preemptions"], j["step"], money(j["cost_usd"]),
          rate(j.get("steps_per_second")), money(j.get("cost_per_1000_steps")), format_duration(j["age_seconds"])]
         for j in jobs],
        empty="No jobs match." if filtered else "No jobs yet: `runner submit JOB.yaml` starts one.",
    )


@click.command()
@job_id_argument
@click.option("--json", "as_json", is_flag=True)
def status(job_id: str, as_json: bool):
    """One job in full, with its current attempt and node."""
    job = connect().get(f"/v1/jobs/{job_id}")
    if as_json:
        return print_json(job)
    current = job["current_attempt"] or {}
    node = job.get("node") or {}
    lines = [
        ("id", job["id"]), ("name", job["name"]), ("state", job["state"]), ("message", job["message"]),
        ("failure", job.get("failure")),
        ("attempts", job["attempts"]), ("preemptions", job["preemptions"]), ("failures", job["failures"]),
        ("step", job["step"]), ("cost", money(job["cost_usd"])),
        ("steps/s", rate(job.get("steps_per_second"))), ("$/1k steps", money(job.get("cost_per_1000_steps"))),
        ("goodput", _goodput(job.get("goodput"))),
        ("age", format_duration(job["age_seconds"])),
        ("attempt", current.get("attempt")),
        ("where", " ".join(str(current.get(k)) for k in ("cloud", "zone", "instance_type")) if current else None),
        ("price", f"{money(current.get('price_per_hour'))}/h {'spot' if current.get('spot') else 'on-demand'}"
         if current else None),
        ("node", f"{node.get('id')} ({node.get('state')}, last heartbeat {node.get('last_heartbeat')})"
         if node else None),
        ("cost policy", job.get("cost_policy")),
        ("run", job["spec"]["run"]),
        ("manifest", _manifest(job.get("manifest"))),
        ("save failed", (f"{job['last_checkpoint_failure']['time']} "
                                    f"{job['last_checkpoint_failure']['message']}")
         if job.get("last_checkpoint_failure") else None),
    ]
    for key, value in lines:
        if value is not None:
            click.echo(f"{key + ':':<13}{value}")


@click.command()
@job_id_argument
@click.option("--attempt", type=int, help="Only this attempt.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--node", "rank", type=int, default=None,
              help="Of a multi-node job: only this node rank's output (default: every node's, node 0 first).")
def logs(job_id: str, attempt: int | None, follow: bool, rank: int | None):
    """The job's output, every attempt, each under a separator line."""
    follow_logs(connect(), job_id, attempt, follow, only_node=rank)


@click.command()
@job_id_argument
@click.option("--json", "as_json", is_flag=True)
@click.option("--wide", is_flag=True, help="Every column: prices, times, exit codes and the training's figures.")
def restarts(job_id: str, as_json: bool, wide: bool):
    """The restart log: one row per attempt."""
    rows = connect().get(f"/v1/jobs/{job_id}/restarts")
    if as_json:
        return print_json(rows)
    print_restart_log(rows, wide=wide)


# The restart log's columns: (header, cell of a row, shown without --wide). What a row says about recovery comes
# by default and fits 80 columns; prices, times, exit codes and the training's figures need --wide.
RESTART_COLUMNS = (
    ("#", lambda r: r["attempt"], True),
    ("WHERE", lambda r: f"{r['zone']} {r['instance_type']}", True),
    ("PRICE/H", lambda r: money(r["price_per_hour"]), False),
    ("STARTED", lambda r: _when(r["started_at"]), False),
    ("ENDED", lambda r: _when(r["ended_at"]), False),
    ("REASON", lambda r: r["end_reason"], True),
    ("NOTICE", lambda r: _notice(r), True),
    ("SAVED", lambda r: r["checkpoint_step"], True),
    ("RESUMED", lambda r: r["resumed_from_step"], True),
    ("LOST", lambda r: None if r["lost_seconds"] is None else f"{r['lost_seconds']:.1f}s", True),
    ("COST", lambda r: money(r["cost_usd"]), True),
    ("EXIT", lambda r: r["exit_code"], False),
    ("DRILL", lambda r: _drill(r), True),
    ("STEPS", lambda r: r.get("steps"), False),
    ("PEAK MEM", lambda r: gigabytes(r.get("peak_memory_gb")), False),
    ("NAN", lambda r: r.get("nan_steps"), False),
)
WRAPPED = ("WHERE", "NOTICE", "DRILL", "NODES", "WORLD", "STARTED", "ENDED")  # wrap to fit the terminal; the rest stay whole


def print_restart_log(rows: list[dict], err: bool = False, wide: bool = False) -> None:
    columns = [c for c in RESTART_COLUMNS if wide or c[2]]
    headers, cells = [c[0] for c in columns], [c[1] for c in columns]
    if any(r.get("nodes") for r in rows):  # a multi-node job: each node rank's end, and the noticed rank
        headers.append("NODES")
        cells.append(_nodes)
    if any(r.get("world_sizes") for r in rows):  # an elastic gang: its world sizes within each attempt
        headers.append("WORLD")
        cells.append(_world_sizes)
    print_table(headers, [[cell(r) for cell in cells] for r in rows], empty="No attempts yet.", err=err, wrap=WRAPPED,
                gap=1)
    if rows and not wide:
        click.echo("(--wide adds prices, times, exit codes, steps and memory)", err=err)


def _manifest(manifest: dict | None) -> str | None:
    """``commit 1a2b3c4 (dirty), python 3.11.7, torch 2.5.1, cuda 12.4, 8 GPUs (NVIDIA H100)``."""
    if not manifest:
        return None
    commit = manifest.get("git_commit")
    parts = [f"commit {commit[:12]}{' (dirty)' if manifest.get('git_dirty') else ''}" if commit else "no git commit"]
    parts += [f"{key} {manifest[key]}" for key in ("python", "torch", "cuda") if manifest.get(key)]
    gpus = manifest.get("gpus") or []
    if gpus:
        parts.append(f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(sorted(set(gpus)))})")
    return ", ".join(parts)


def _goodput(goodput: dict | None) -> str | None:
    """``82.0% (training 41m of 50m paid, 2m redone)``: node time spent on kept steps, of all paid for."""
    if not goodput or goodput.get("ratio") is None:
        return None
    return (f"{goodput['ratio']:.1%} (training {format_duration(goodput['training_seconds'])} of "
            f"{format_duration(goodput['paid_seconds'])} paid, {format_duration(goodput['redone_seconds'])} redone)")


def _notice(row: dict) -> str | None:
    """The notice's source (of a gang, the NODES column says which rank it reached)."""
    return (row["notice"] or {}).get("source")


def _when(iso: str | None) -> str | None:
    """``2026-11-21 10:00:00Z``: a date and a time that may wrap onto two lines."""
    return iso.replace("T", " ") if iso else None


def _nodes(row: dict) -> str:
    """``0:kept 1:preempted``: each node rank's end."""
    return " ".join(f"{n['rank']}:{n['end_reason']}" for n in row.get("nodes") or [])


def _world_sizes(row: dict) -> str | None:
    """``3 >140> 2 >300> 3``: an elastic gang's world sizes, each change with its step."""
    sizes = row.get("world_sizes") or []
    if not sizes:
        return None
    return " ".join([str(sizes[0]["world_size"])] + [f">{s['step']}> {s['world_size']}" for s in sizes[1:]])


def _drill(row: dict) -> str | None:
    drill = row.get("drill")
    if not drill:
        return None
    if drill.get("passed") is None:
        return "skipped" if drill.get("message") else "running"
    return "passed" if drill["passed"] else f"FAILED: {drill.get('message')}"


@click.command()
@job_id_argument
def cancel(job_id: str):
    """Stop the job and release its node."""
    result = connect().post(f"/v1/jobs/{job_id}/cancel")
    if result["changed"]:
        click.echo(f"cancelling {job_id}")
    else:
        click.echo(f"{job_id} already ended ({result['state']})")


@click.command()
@job_id_argument
@click.option("--notice", type=click.Choice(["aws", "gcp", "azure", "none"]), default="aws", show_default=True,
              help="The cloud whose notice protocol is used; none: the node vanishes without a notice (its "
                   "processes are killed at once).")
@click.option("--node", "rank", type=int, default=0, show_default=True,
              help="Of a multi-node job: the rank of the node to preempt.")
@click.option("--no-reclaim", is_flag=True,
              help="A false notice: the notice is sent but the node is not reclaimed at its deadline.")
@click.option("--rebalance", is_flag=True,
              help="Only an AWS rebalance recommendation (no notice, no reclaim); needs --notice aws.")
def preempt(job_id: str, notice: str, rank: int, no_reclaim: bool, rebalance: bool):
    """Chaos (local provider): a preemption notice through that cloud's metadata protocol, then the node's loss
    (--notice none: the node vanishes at once, without a notice)."""
    if rebalance and notice != "aws":
        raise click.UsageError("--rebalance is an AWS signal: use it with --notice aws")
    if no_reclaim and notice == "none":
        raise click.UsageError("--no-reclaim is a false notice; --notice none sends no notice: the node vanishes")
    result = connect().post(f"/v1/jobs/{job_id}/preempt",
                            {"notice": notice, "node": rank, "reclaim": not no_reclaim, "rebalance": rebalance})
    which = f"node {result['node']}" + (f" (rank {result['rank']})" if result.get("rank") else "")
    if notice == "none":
        click.echo(f"{which} vanished without a notice (its processes were killed)")
        return
    label = {"aws": "an AWS", "gcp": "a GCP", "azure": "an Azure"}[notice]
    if rebalance:
        click.echo(f"sent an AWS rebalance recommendation to {which}")
    elif no_reclaim:
        click.echo(f"sent {label} notice to {which}; it is not reclaimed (a false notice)")
    else:
        click.echo(f"sent {label} notice to {which}; it is reclaimed in {result['grace_seconds']:.1f}s")
