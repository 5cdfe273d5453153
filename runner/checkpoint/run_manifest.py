"""What a run ran with (docs/restart-log.md): commit, Python, torch, CUDA, GPUs, installed packages, argv.

The commit is the working directory's when it is a git repository, else the one ``runner submit`` recorded
in the shipped workdir (runner/source.py). Sent once per attempt at the first ``restore()``. A value the node cannot know is None. The environment is
never read into it (it may hold secrets); ``argv`` is the process's own, as it got it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import sys

from ..source import git_state, shipped_state
from . import cuda_gate


def packages_sha256() -> str | None:
    """sha256 over the sorted ``name==version`` lines of every installed distribution."""
    try:
        lines = {f"{(dist.metadata['Name'] or '').lower()}=={dist.version}"
                 for dist in importlib.metadata.distributions() if dist.metadata["Name"]}
    except Exception:  # a broken distribution's metadata must not stop the training
        return None
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest() if lines else None


def _torch_facts() -> tuple[str | None, str | None, list[str]]:
    """torch's version, the CUDA it was built for, and the visible GPUs' names (torch imported by the training)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None, []
    cuda = getattr(torch.version, "cuda", None)
    gpus: list[str] = []
    cuda_gate.wait_open()  # the names initialise CUDA: after a hold before CUDA, and without saying ``waiting``
    try:
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a driver that answers is_available() but not the names: the list stays unknown
        gpus = []
    return torch.__version__, cuda, gpus


def run_manifest(cwd: str | None = None) -> dict:
    """The manifest of this process: ``{"git_commit", "git_dirty", "python", "torch", "cuda", "gpus",
    "packages_sha256", "argv"}``."""
    commit, dirty = git_state(cwd)
    if commit is None:  # a workdir shipped by the runner: the state `runner submit` recorded
        commit, dirty = shipped_state(cwd)
    torch_version, cuda, gpus = _torch_facts()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch_version,
        "cuda": cuda,
        "gpus": gpus,
        "packages_sha256": packages_sha256(),
        "argv": list(sys.argv),
    }
