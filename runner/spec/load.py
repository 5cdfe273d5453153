"""Loading a job file: YAML parsing, schema validation, messages that name the key."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..validation import problems as key_problems
from .deadline import deadline_problem
from .errors import SpecError
from .schema import JobSpec
from .workdir import escaping_links


def load_job_file(path: str | os.PathLike) -> JobSpec:
    """Read and validate a job file; ``workdir`` comes back absolute."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found"]) from None
    except OSError as exc:
        raise SpecError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), [f"not a text YAML file (byte {exc.object[exc.start]:#04x} at offset {exc.start} is "
                                    "not UTF-8); give the job's .yaml file"]) from None
    if "\0" in text:
        raise SpecError(str(path), [f"not a text YAML file (a NUL byte at offset {text.index(chr(0))}); give the "
                                    "job's .yaml file"])
    spec = parse_job(text, source=str(path))
    workdir = (path.parent / spec.workdir).resolve()
    if not workdir.is_dir():
        raise SpecError(str(path), [f"workdir: {spec.workdir!r} is not a folder (resolved to {workdir})"])
    problems = escaping_links(workdir)
    if problems:
        raise SpecError(str(path), problems)
    return spec.model_copy(update={"workdir": str(workdir)})


def parse_job(text: str, source: str = "job") -> JobSpec:
    """Validate job-file text (YAML or JSON)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise SpecError(source, [f"{where}not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    return validate_job(data, source)


def validate_job(data: Any, source: str = "job") -> JobSpec:
    """Validate already-parsed job data."""
    if not isinstance(data, dict):
        raise SpecError(source, ["the job file must be a mapping of keys such as name: and run:"])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, key_problems(exc, JobSpec)) from None
    problem = deadline_problem(spec.recovery.deadline, time.time())  # at submit: now is the submission
    problems = [problem] if problem else []
    problems += unknown_accelerators(spec.resources)
    if problems:
        raise SpecError(source, problems)
    return spec


def unknown_accelerators(resources) -> list[str]:
    """One problem per alternative of ``resources.accelerators`` that no cloud of the catalog offers.

    The same list of names backs `runner validate` (offline) and the controller at submit."""
    from ..providers.catalog import known_accelerators  # the catalog CSV, read once

    known = known_accelerators()
    upper = {name.upper() for name in known}
    listed = isinstance(resources.accelerators, list)
    return [f"resources.accelerators{f'[{i}]' if listed else ''}: unknown accelerator {name!r}; "
            f"known accelerators are {', '.join(known)}"
            for i, (name, _) in enumerate(resources.accelerator_options()) if name.upper() not in upper]
