"""A controller whose local nodes start as cloud nodes do: each runs the real bootstrap script.

``python bootstrap_market.py DATA_DIR SHIMS``: serves like `runner server --data-dir DATA_DIR --port 0`, with
the local market's launch replaced. A node's launch renders the bootstrap script (runner/providers/bootstrap.sh)
and runs it with bash in the node's own folder as its root (/opt/runner, /etc/runner, /var/lib/runner and the
systemd unit folder all under ``NODE_DIR/root``), with ``SHIMS`` first on PATH: a ``python3`` whose venvs see
this Python's installed packages (so pip needs no index for the runner's dependencies) and a ``systemctl`` that
starts the unit's ExecStart. The node installs the runner from the wheel its controller serves, and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runner.controller.daemon import ServerSettings, serve
from runner.providers.bootstrap import render_bootstrap
from runner.providers.local import LocalProvider
from runner.providers.local.processes import process_ref

FOLDERS = {"RUNNER_OPT_DIR": "opt/runner", "RUNNER_ETC_DIR": "etc/runner", "RUNNER_STATE_DIR": "var/lib/runner",
           "RUNNER_UNIT_DIR": "etc/systemd/system"}


class BootstrapMarket(LocalProvider):
    def __init__(self, data_dir: Path, shims: Path):
        super().__init__(data_dir)
        self.shims = shims

    def _spawn(self, request, node_dir: Path, lock_fd: int) -> str:
        root = node_dir / "root"
        folders = {key: root / path for key, path in FOLDERS.items()}
        folders["RUNNER_UNIT_DIR"].mkdir(parents=True, exist_ok=True)
        script = node_dir / "bootstrap.sh"
        script.write_text(render_bootstrap(request.bootstrap, cloud="local", zone=request.offer.zone))
        # A fresh machine: none of the controller's variables, no PYTHONPATH (the runner must come from the wheel),
        # no package index (the wheel's dependencies are already installed, see the python3 shim).
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("RUNNER_", "PIP_", "PYTHON"))}
        env.update({key: str(path) for key, path in folders.items()})
        env.update(PATH=f"{self.shims}{os.pathsep}{env.get('PATH', '')}", PIP_NO_INDEX="1",
                   PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
        with open(node_dir / "node.log", "ab") as out:
            child = subprocess.Popen(["bash", str(script)], stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(lock_fd,), env=env)
        self._children[request.node_id] = child
        ref = process_ref(child.pid)
        (node_dir / "ref").write_text(ref)
        return ref


if __name__ == "__main__":
    data_dir, shims = Path(sys.argv[1]), Path(sys.argv[2])
    serve(ServerSettings(data_dir=data_dir, port=0), providers={"local": BootstrapMarket(data_dir, shims)})
