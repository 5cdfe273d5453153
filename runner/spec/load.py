"""Loading a job file: YAML parsing, schema validation, messages that name the key."""

from __future__ import annotations

import difflib
import os
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

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
        raise SpecError(source, [_describe(err) for err in exc.errors()]) from None
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


_UNION_MEMBERS = ("str", "float", "int", "bool")  # pydantic's tags for the members of a Union field


def _describe(err: dict) -> str:
    parts = [p for p in err["loc"] if p not in _UNION_MEMBERS]  # "interval.float" is the key interval
    loc = [str(part) for part in parts if not isinstance(part, int)]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{key}: unknown key{_suggestion(loc)}"
    if kind == "missing":
        return f"{key}: required key is missing"
    message = err["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    if message.startswith("["):  # a validator naming one item of a list: resources.accelerators[1]: ...
        return f"{key}{message}"
    value = err.get("input")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
        return f"{key}: {message} (got {value!r})"
    return f"{key}: {message}"


def _suggestion(loc: list[str]) -> str:
    """'(did you mean ...)' for a misspelt key, looked up in the model that owns it."""
    model: type[BaseModel] = JobSpec
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(model.model_fields)})"
