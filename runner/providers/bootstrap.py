"""The boot script a cloud node runs first (AWS user data, GCP ``startup-script``).

It installs the runner, writes the agent's config (controller URL, node id, the node's own token:
never cloud credentials) and starts the agent's systemd unit. Rendered from deploy/bootstrap.sh.
"""

from __future__ import annotations

import shlex
from importlib import resources

from .. import __version__
from .base import NodeBootstrap

DEFAULT_PACKAGE = f"runner=={__version__}"


def render_bootstrap(bootstrap: NodeBootstrap, *, cloud: str, zone: str, package: str | None = None) -> str:
    """The shell script for one node; every value is shell-quoted."""
    template = resources.files("runner.providers").joinpath("bootstrap.sh").read_text()
    values = {
        "CONTROLLER_URL": bootstrap.controller_url,
        "NODE_ID": bootstrap.node_id,
        "NODE_TOKEN": bootstrap.token,
        "CLOUD": cloud,
        "ZONE": zone,
        "PACKAGE": package or DEFAULT_PACKAGE,
    }
    for key, value in values.items():
        template = template.replace(f"@{key}@", shlex.quote(value))
    return template
