"""One way to check a file a person writes: a pydantic model per section, and messages that name the key path
and the fix (``clouds.aws.regions: give a list of region names, e.g. [us-east-1]``).

The job file (runner/spec/), config.yaml (runner/home.py, the clouds' sections in runner/providers/) and the
agent's config (agents/config.py) all validate through :func:`validate`. The agent imports this module, so it
needs only pydantic and the standard library.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)

_UNION_MEMBERS = ("str", "float", "int", "bool", "list[str]", "dict[str,str]", "dict[str,union[str,list[str]]]")


class Section(BaseModel):
    """A section of a file: unknown keys refused (with a suggestion), values frozen, no inf or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def validate(model: type[M], data: Any, *, where: str = "", source: str | None = None,
             error: type[Exception]) -> M:
    """``data`` as ``model``; else ``error`` with one line per key at fault, each ``WHERE.KEY: what and the fix``
    (``where``: the section's key path, "" for keys at the top of a file), after ``SOURCE: `` when given."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = problems(exc, model, where)
        raise error("\n".join(f"{source}: {line}" if source else line for line in lines)) from None


def problems(exc: ValidationError, model: type[BaseModel], where: str = "") -> list[str]:
    """One line per error of ``exc``: the key path under ``where``, what is wrong, and the fix."""
    return [describe(err, model, where) for err in exc.errors()]


def describe(err: dict, model: type[BaseModel], where: str = "") -> str:
    parts = [p for p in err["loc"] if str(p).replace(" ", "").lower() not in _UNION_MEMBERS]
    loc = [str(part) for part in parts if not isinstance(part, int)]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    key = ".".join(p for p in (where, key) if p) or "(top level)"
    kind = err["type"]
    message = err["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    if not parts and kind == "value_error":  # a check across keys: its message names them
        return f"{where}: {message}" if where else message
    if kind == "extra_forbidden":
        return f"{key}: unknown key{_suggestion(model, loc)}"
    if kind == "missing":
        return f"{key}: required key is missing"
    if message.startswith(("[", ".")):  # a validator naming one item: resources.accelerators[1]: ... key_name.x: ...
        return f"{key}{message}"
    value = err.get("input")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
        return f"{key}: {message} (got {value!r})"
    return f"{key}: {message}"


def _suggestion(model: type[BaseModel], loc: list[str]) -> str:
    """'(did you mean ...)' for a misspelt key, looked up in the model that owns it."""
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        section = next((t for t in (annotation, *get_args(annotation))  # Optional[Section] too
                        if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if section is None:
            return ""
        model = section
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1) if loc else []
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(model.model_fields)})"
