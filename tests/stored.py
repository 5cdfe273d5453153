"""Typed values for tests that write the controller's rows directly: a job's spec and a node's offer."""

from __future__ import annotations

from runner.spec import validate_job
from runner.spec.stored import StoredJob, stored_job
from runner.state.values import Offer

_OFFER = {"cloud": "local", "region": "local", "zone": "local-a", "instance_type": "cpu", "accelerator": None,
          "accelerator_count": 0, "cpus": 2, "memory_gb": 4.0, "spot_price": 0.1, "on_demand_price": 0.3}


def job_spec(name: str = "job", workdir_digest: str | None = None, **sections) -> StoredJob:
    """A valid stored spec: ``run: "true"`` and the given sections (``resources={"num_nodes": 2}``)."""
    return stored_job(validate_job({"name": name, "run": "true", **sections}), workdir_digest)


def offer(**fields) -> Offer:
    """An offer with the given fields, the rest a small local CPU node's."""
    return Offer(**{**_OFFER, **fields})
