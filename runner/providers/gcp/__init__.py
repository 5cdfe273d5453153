"""The GCP provider: Compute Engine Spot and on-demand VMs (install with ``pip install 'spot-runner[gcp]'``)."""

from .errors import GCPConfigError
from .provider import GCPProvider

__all__ = ["GCPConfigError", "GCPProvider"]
