"""Pure builders for Compute Engine requests: config, names, labels and the instance body.

Nothing here imports the SDK. The instance body is REST JSON (camelCase), exactly what the API
receives; the provider turns it into ``compute_v1.Instance`` with ``Instance.from_json``.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Optional

from pydantic import Field, field_validator

from ...validation import Section, validate
from ..base import LaunchRequest
from ..errors import ProviderError
from .errors import GCPConfigError

# GPUs attached to N1 machines as guest accelerators; A2, A3, A4 and G2 machine types come with theirs.
N1_ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
}
BUNDLED_GPU_FAMILIES = frozenset({"a2", "a3", "a4", "g2"})

LABEL_MANAGED = "runner-managed"
LABEL_NODE = "runner-node"
LABEL_JOB = "runner-job"
LABEL_ATTEMPT = "runner-attempt"
STARTUP_SCRIPT_KEY = "startup-script"
# Deep Learning VM images install the NVIDIA driver at first boot only when asked (other images ignore it).
INSTALL_DRIVER_KEY = "install-nvidia-driver"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PREEMPTED_OPERATION = "compute.instances.preempted"

# Fixed namespace: the same node id always gives the same request id, across controller restarts.
REQUEST_NAMESPACE = uuid.UUID("5b0c7d1e-2f4a-5e2b-9a51-7c3e0f6d8a42")

NAME_PREFIX = "runner-"
MAX_NAME = 63
ZONE = re.compile(r"^[a-z]+(-[a-z]+)*\d+-[a-z]$")
PROJECT = re.compile(r"^[a-z][-a-z0-9.:]{4,61}[a-z0-9]$")


def _text(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{value!r} must be a non-empty string")
    return value.strip()


def _required(value):
    if not value:
        raise ValueError("required; see docs/gcp.md for an example")
    return value


_MARKED_TEXT = {"service_account": ("@", "an email such as runner@PROJECT.iam.gserviceaccount.com"),
                "checkpoint_url": ("://", "a URL such as gs://BUCKET/PREFIX")}


class GCPConfig(Section):
    """``clouds.gcp`` of config.yaml, checked (errors name ``clouds.gcp.KEY`` and the fix)."""

    project: str = Field(default=None, validate_default=True)
    zones: tuple[str, ...] = Field(default=None, validate_default=True)
    image: str = Field(default=None, validate_default=True)
    service_account: Optional[str] = None
    network: Optional[str] = None
    subnetwork: Optional[str] = None
    boot_disk_gb: int = 100
    boot_disk_type: str = "pd-balanced"
    external_ip: bool = True
    agent_package: Optional[str] = None
    checkpoint_url: Optional[str] = None

    @field_validator("project", mode="before")
    @classmethod
    def _project(cls, value):
        project = _text(_required(value))
        if not PROJECT.match(project):
            raise ValueError(f"{project!r} is not a project id (lowercase letters, digits and '-', 6-30 characters, "
                             "as `gcloud projects list` shows it)")
        return project

    @field_validator("zones", mode="before")
    @classmethod
    def _zones(cls, value):
        zones = [value] if isinstance(value, str) else _required(value)
        if not isinstance(zones, list) or not all(isinstance(z, str) for z in zones):
            raise ValueError("must be a list of zone names such as [us-central1-a]")
        for zone in zones:
            if not ZONE.match(zone):
                raise ValueError(f"{zone!r} is not a zone name (like us-central1-a)")
        return tuple(dict.fromkeys(zones))

    @field_validator("image", mode="before")
    @classmethod
    def _image(cls, value):
        return _text(_required(value))

    @field_validator("network", "subnetwork", "agent_package", mode="before")
    @classmethod
    def _optional_text(cls, value):
        return _text(value)

    @field_validator("boot_disk_type", mode="before")
    @classmethod
    def _disk_type(cls, value):
        return _text(value) or "pd-balanced"

    @field_validator("boot_disk_gb", "external_ip", mode="before")
    @classmethod
    def _exact_type(cls, value, info):
        if info.field_name == "external_ip" and not isinstance(value, bool):
            raise ValueError(f"{value!r} must be true or false")
        if info.field_name == "boot_disk_gb" and (isinstance(value, bool) or not isinstance(value, int) or value < 10):
            raise ValueError(f"{value!r} must be a whole number of GB, at least 10")
        return value

    @field_validator(*_MARKED_TEXT, mode="before")
    @classmethod
    def _marked_text(cls, value, info):
        """Text that must contain a mark: an email's @, a URL's ://."""
        text = _text(value)
        mark, example = _MARKED_TEXT[info.field_name]
        if text is not None and mark not in text:
            raise ValueError(f"{text!r} must be {example}")
        return text


def parse_config(raw: dict | None) -> GCPConfig:
    """Check ``clouds.gcp``; every problem raises GCPConfigError naming ``clouds.gcp.KEY``."""
    if not isinstance(raw, dict):
        raise GCPConfigError("clouds.gcp: must be a mapping with at least project, zones and image")
    return validate(GCPConfig, raw, where="clouds.gcp", error=GCPConfigError)


def instance_name(node_id: str) -> str:
    """The VM name for a node: ``runner-<node id>``, made a valid GCE name (a short hash keeps it unique)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", node_id.lower()).strip("-")
    name = f"{NAME_PREFIX}{cleaned}"
    if cleaned == node_id and len(name) <= MAX_NAME and not name.endswith("-"):
        return name
    digest = hashlib.sha256(node_id.encode()).hexdigest()[:8]
    room = MAX_NAME - len(NAME_PREFIX) - len(digest) - 1
    head = cleaned[:room].strip("-")
    return f"{NAME_PREFIX}{head}-{digest}" if head else f"{NAME_PREFIX}{digest}"


def request_id(node_id: str) -> str:
    """The insert's ``requestId``: a UUID5 of the node id, so a retried launch is the same request."""
    return str(uuid.uuid5(REQUEST_NAMESPACE, f"insert/{node_id}"))


def label_value(text: str) -> str:
    """A GCE label value: lowercase letters, digits, '_' and '-', at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", str(text).lower())[:63]


def node_filter(node_id: str) -> str:
    """The list filter that finds a node's VM by its label."""
    return f'labels.{LABEL_NODE} = "{label_value(node_id)}"'


def preempted_filter() -> str:
    """The zone-operations filter for Spot reclaims."""
    return f'operationType = "{PREEMPTED_OPERATION}"'


def make_ref(zone: str, name: str) -> str:
    return f"{zone}/{name}"


def parse_ref(ref: str) -> tuple[str, str]:
    """``zone/name`` -> (zone, name)."""
    zone, _, name = (ref or "").partition("/")
    if not zone or not name or "/" in name:
        raise ProviderError(f"{ref!r} is not a GCP node ref (zone/name)")
    return zone, name


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def guest_accelerators(instance_type: str, accelerator: str | None, count: int, zone: str) -> list[dict]:
    """The ``guestAccelerators`` an offer needs: none for CPU-only and GPU-bundling machine types."""
    if not accelerator:
        return []
    family = instance_type.split("-", 1)[0].lower()
    if family in BUNDLED_GPU_FAMILIES:
        return []
    gpu = N1_ACCELERATORS.get(accelerator.upper())
    if family != "n1" or gpu is None:
        raise ProviderError(f"GCP cannot attach {accelerator} to {instance_type}: only N1 machine types take "
                            f"{', '.join(N1_ACCELERATORS)}, and A2/A3/A4/G2 types come with their own GPUs; "
                            "fix this offer in the catalog")
    return [{"acceleratorType": f"zones/{zone}/acceleratorTypes/{gpu}", "acceleratorCount": count}]


def scheduling(spot: bool, has_gpu: bool) -> dict:
    """Spot: deleted when reclaimed, never restarted. On-demand: standard, also not restarted by GCE (the
    runner recovers the job itself); GPU VMs cannot live-migrate, so they terminate on host maintenance."""
    if spot:
        return {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    return {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE" if has_gpu else "MIGRATE",
            "automaticRestart": False}


def metadata_items(startup_script: str, has_gpu: bool) -> list[dict]:
    """The VM's metadata: the bootstrap as ``startup-script``; on GPU machines, the driver install flag."""
    items = [{"key": STARTUP_SCRIPT_KEY, "value": startup_script}]
    if has_gpu:
        items.append({"key": INSTALL_DRIVER_KEY, "value": "True"})
    return items


def labels(request: LaunchRequest) -> dict[str, str]:
    return {
        LABEL_MANAGED: "true",
        LABEL_NODE: label_value(request.node_id),
        LABEL_JOB: label_value(request.job_id),
        LABEL_ATTEMPT: str(int(request.attempt)),
    }


def network_interface(config: GCPConfig, zone: str) -> dict:
    interface: dict = {}
    if config.network or not config.subnetwork:
        network = config.network or "default"
        interface["network"] = network if "/" in network else f"global/networks/{network}"
    if config.subnetwork:
        sub = config.subnetwork
        interface["subnetwork"] = sub if "/" in sub else f"regions/{region_of(zone)}/subnetworks/{sub}"
    if config.external_ip:
        interface["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    return interface


# Machine series that a compact placement policy can place close together (low network latency).
COMPACT_PLACEMENT_SERIES = frozenset({"a2", "a3", "a4", "g2", "c2", "c2d", "c3", "c3d", "c4", "h3", "n2", "n2d"})


def supports_compact_placement(instance_type: str) -> bool:
    """Whether a machine type's series takes a compact placement policy."""
    return instance_type.split("-")[0] in COMPACT_PLACEMENT_SERIES


def placement_policy_name(job_id: str) -> str:
    """One compact placement policy per job (every attempt's gang uses it); a valid resource name."""
    cleaned = re.sub(r"[^a-z0-9-]", "-", job_id.lower())
    return (NAME_PREFIX + cleaned)[:MAX_NAME].rstrip("-")


def placement_policy_body(job_id: str) -> dict:
    """The REST body of ``resourcePolicies.insert``: VMs that use it are collocated. No ``vmCount``: a
    replacement may join while the VM it replaces is still being deleted."""
    return {"name": placement_policy_name(job_id), "description": f"runner gang of job {job_id}",
            "groupPlacementPolicy": {"collocation": "COLLOCATED"}}


def gang_placement_policy(config: GCPConfig, request: LaunchRequest) -> str | None:
    """The resource policy URL a node uses: its job's, for a gang of a series that supports one."""
    if request.gang_size > 1 and supports_compact_placement(request.offer.instance_type):
        region = region_of(request.offer.zone)
        return f"projects/{config.project}/regions/{region}/resourcePolicies/{placement_policy_name(request.job_id)}"
    return None


def instance_body(config: GCPConfig, request: LaunchRequest, startup_script: str) -> dict:
    """The REST body of ``instances.insert`` for one node."""
    offer = request.offer
    zone = offer.zone
    accelerators = guest_accelerators(offer.instance_type, offer.accelerator, offer.accelerator_count, zone)
    body = {
        "name": instance_name(request.node_id),
        "machineType": f"zones/{zone}/machineTypes/{offer.instance_type}",
        "labels": labels(request),
        "metadata": {"items": metadata_items(startup_script, has_gpu=bool(offer.accelerator))},
        "scheduling": scheduling(request.spot, has_gpu=bool(offer.accelerator)),
        "disks": [{
            "boot": True,
            "autoDelete": True,
            "type": "PERSISTENT",
            "initializeParams": {
                "sourceImage": config.image,
                "diskSizeGb": str(config.boot_disk_gb),
                "diskType": f"zones/{zone}/diskTypes/{config.boot_disk_type}",
                "labels": {LABEL_MANAGED: "true", LABEL_NODE: label_value(request.node_id)},
            },
        }],
        "networkInterfaces": [network_interface(config, zone)],
    }
    if accelerators:
        body["guestAccelerators"] = accelerators
    policy = gang_placement_policy(config, request)
    if policy:  # a gang: its VMs collocated by the job's compact placement policy
        body["resourcePolicies"] = [policy]
    if config.service_account:
        body["serviceAccounts"] = [{"email": config.service_account, "scopes": [CLOUD_PLATFORM_SCOPE]}]
    return body
