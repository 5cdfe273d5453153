"""The job file's checkpoint settings, as the agent exports them, as defaults of a Checkpointer (docs/job-file.md),
and the check of a Checkpointer's options.

``checkpoint.interval`` arrives as ``RUNNER_CHECKPOINT_INTERVAL`` (absent for ``auto``) and ``checkpoint.keep``
as ``RUNNER_CHECKPOINT_KEEP``. A value given in code wins; when it differs from the job file's, one plain log
line names both, once per process and setting.
"""

from __future__ import annotations

import os

from runner.protocol import environment as env

from .errors import CheckpointConfigError
from .interval import parse_duration
from .log import get_logger

log = get_logger()

ENV_INTERVAL = env.CHECKPOINT_INTERVAL
ENV_KEEP = env.CHECKPOINT_KEEP
DEFAULT_INTERVAL = "auto"
DEFAULT_KEEP = 3

_told: set[str] = set()


def _job_interval():
    raw = os.environ.get(ENV_INTERVAL, "").strip()
    if not raw:
        return None
    if raw.lower() == "auto":
        return "auto"
    try:
        parse_duration(raw)
    except ValueError:
        log.warning(f"ignoring {ENV_INTERVAL}={raw!r}: not a duration such as 30s, 10m or 1h")
        return None
    return raw


def _job_keep():
    raw = os.environ.get(ENV_KEEP, "").strip()
    if not raw:
        return None
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        log.warning(f"ignoring {ENV_KEEP}={raw!r}: not an integer of at least 1")
        return None
    return keep


def _same_interval(a, b) -> bool:
    if isinstance(a, str) and a.strip().lower() == "auto" or isinstance(b, str) and b.strip().lower() == "auto":
        return str(a).strip().lower() == str(b).strip().lower()
    try:
        return parse_duration(a) == parse_duration(b)
    except ValueError:
        return False


def _choose(name: str, code, job, default, same) -> object:
    if code is None:
        return job if job is not None else default
    if job is not None and not same(code, job) and name not in _told:
        _told.add(name)
        log.info(f"checkpoint {name}: the code's {code!r} is used, not the job file's {job!r}")
    return code


def interval(code):
    """The interval a Checkpointer uses: the code's, else the job file's, else 'auto'."""
    return _choose("interval", code, _job_interval(), DEFAULT_INTERVAL, _same_interval)


def keep(code):
    """How many committed checkpoints are kept: the code's, else the job file's, else 3."""
    return _choose("keep", code, _job_keep(), DEFAULT_KEEP, lambda a, b: a == b)


def check_options(objects: dict, extra, keep, every_steps, interval) -> float | None:
    """Check a Checkpointer's arguments (TypeError or CheckpointConfigError, naming the argument and the fix);
    the fixed interval in seconds, None for ``auto``."""
    for name, obj in objects.items():
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"Checkpointer({name}=...): {type(obj).__name__} has no state_dict()/"
                            f"load_state_dict(); put plain values in extra={{{name!r}: ...}}")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError("Checkpointer(extra=...) takes a dict of plain values, such as extra={'tokens': 0}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointConfigError(f"Checkpointer(keep={keep!r}): keep must be an integer of at least 1")
    if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                    or every_steps < 1):
        raise CheckpointConfigError(f"Checkpointer(every_steps={every_steps!r}): use a positive integer or None")
    if isinstance(interval, str) and interval.strip().lower() == "auto":
        return None
    try:
        return parse_duration(interval)
    except ValueError as exc:
        raise CheckpointConfigError(f"Checkpointer(interval=...): {exc}; or use 'auto'") from exc
