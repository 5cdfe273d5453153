"""Write the job file's JSON Schema for editors: ``python -m runner.spec.jsonschema > docs/job-schema.json``."""

from __future__ import annotations

import json

from .schema import JobSpec


def job_json_schema() -> dict:
    """The JSON Schema generated from the same models that validate job files."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "runner job file"
    return schema


if __name__ == "__main__":
    print(json.dumps(job_json_schema(), indent=2, sort_keys=True))
