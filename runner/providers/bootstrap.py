"""The boot script a cloud node runs first (AWS user data, GCP ``startup-script``).

It installs the runner from the wheel its controller serves (``GET /v1/agent/wheel``, fetched with the node's
own token: the node always runs its controller's version, and never takes the runner from a public package
index; the runner's dependencies come from the node's configured index), writes the agent's config
(controller URL, node id, the node's own token: never cloud credentials) and starts the agent's systemd
unit. Rendered from runner/providers/bootstrap.sh.

Its folders are variables with the real defaults (``RUNNER_OPT_DIR`` /opt/runner, ``RUNNER_ETC_DIR``
/etc/runner, ``RUNNER_STATE_DIR`` /var/lib/runner, ``RUNNER_UNIT_DIR`` /etc/systemd/system), so that a test
can run the real script in a throwaway folder.
"""

from __future__ import annotations

import shlex
from importlib import resources

from ..distribution import wheel_filename
from .base import NodeBootstrap

# The extras a node of each cloud installs with the wheel: the filesystem of that cloud's buckets, where its
# jobs' checkpoints usually go.
CLOUD_EXTRAS = {"aws": "[s3]", "gcp": "[gcs]"}


def render_bootstrap(bootstrap: NodeBootstrap, *, cloud: str, zone: str, package: str | None = None) -> str:
    """The shell script for one node; every value is shell-quoted. ``package``: a pip requirement to install
    instead of the controller's wheel (``clouds.CLOUD.agent_package``, from the node's own index)."""
    template = resources.files("runner.providers").joinpath("bootstrap.sh").read_text()
    values = {
        "CONTROLLER_URL": bootstrap.controller_url,
        "NODE_ID": bootstrap.node_id,
        "NODE_TOKEN": bootstrap.token,
        "CLOUD": cloud,
        "ZONE": zone,
        "PACKAGE": package or "",
        "WHEEL": wheel_filename(),
        "EXTRAS": CLOUD_EXTRAS.get(cloud, ""),
    }
    for key, value in values.items():
        template = template.replace(f"@{key}@", shlex.quote(value))
    return template
