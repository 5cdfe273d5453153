"""A job's spec as the controller stores it: the validated job file and the uploaded workdir's digest.

The state layer turns a ``jobs.spec`` row into a :class:`StoredJob` once, when it reads the row, so the rest of
the controller uses attributes (``job.spec.recovery.deadline``). The stored JSON is ``model_dump()``, the same
text every version wrote. A spec stored by another version still loads: a key it lacks takes its default, and a
key this version does not know (a newer version's) is set aside rather than refused, and what depends on the
machine (an fsspec filesystem installed for ``checkpoint.durable_url``) is not checked again: the job was
accepted when it was submitted.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Optional

from pydantic import BaseModel, Field

from .schema import STORED, JobSpec


class StoredJob(JobSpec):
    """The job file as accepted at submit, with ``workdir_digest`` (None for a job without a workdir)."""

    workdir_digest: Optional[str] = Field(default=None, description="The sha256 of the uploaded workdir.")

    def to_json(self) -> dict:
        """The JSON the ``jobs.spec`` column holds."""
        return self.model_dump()


def stored_job(spec: JobSpec, workdir_digest: str | None) -> StoredJob:
    """The spec a submit stores."""
    return StoredJob.model_validate({**spec.model_dump(), "workdir_digest": workdir_digest})


def _known(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and its sections) does not know."""
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        annotation = field.annotation
        out[key] = _known(annotation, value) if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
            else value
    return out


@lru_cache(maxsize=4096)
def load_stored_job(text: str) -> StoredJob:
    """The ``jobs.spec`` column's text as a StoredJob (parsed once per distinct text: a spec is fixed at submit,
    and the model is frozen, so every reader of one job shares it)."""
    return StoredJob.model_validate(_known(StoredJob, json.loads(text)), context={STORED: True})
