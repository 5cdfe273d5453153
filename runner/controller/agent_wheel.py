"""The wheel a cloud node installs the runner from: this controller's own version, served to its nodes.

A node never takes the runner from a public package index (where another project may hold the name, or a
different version sits): its bootstrap script fetches ``GET /v1/agent/wheel`` with its own token and
installs that file. The wheel is built once, at the first request, and kept under the data dir:

- from the source tree the controller runs from (a checkout, or an editable install): ``pip wheel --no-deps``
  on a copy of it, so the tree itself gains no build folders;
- otherwise from the installed distribution: its files and metadata packed back into a wheel.

The wheel holds the runner alone; its dependencies come from the node's configured package index.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import structlog

from ..distribution import DIST_NAME, wheel_filename
from ..errors import RunnerError

log = structlog.get_logger(__name__)

PACKAGES = ("runner", "agents")
BUILD_TIMEOUT_SECONDS = 300


class WheelUnavailable(RunnerError):
    """The controller cannot produce its wheel; the message says why."""


class AgentWheel:
    """This controller's wheel, built on first use into ``cache_dir`` (one build at a time)."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = Path(cache_dir)
        self._lock = threading.Lock()
        self._path: Path | None = None

    def path(self) -> Path:
        with self._lock:
            if self._path is None or not self._path.exists():
                self._path = self._build()
            return self._path

    def _build(self) -> Path:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        target = self.cache_dir / wheel_filename()
        with tempfile.TemporaryDirectory(dir=self.cache_dir, prefix=".build-") as work:
            source = source_tree()
            built = build_from_source(source, Path(work)) if source else repack_installed(Path(work))
            os.replace(built, target)  # atomic: controllers sharing a data dir never see half a wheel
        log.info("agent wheel ready", path=str(target), size=target.stat().st_size,
                 source=str(source) if source else "installed distribution")
        return target


def source_tree() -> Path | None:
    """The project folder this controller runs from, when it is a source tree of this distribution."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not (pyproject.is_file() and all((root / p / "__init__.py").is_file() for p in PACKAGES)):
        return None
    if not re.search(rf'^name\s*=\s*"{re.escape(DIST_NAME)}"', pyproject.read_text(), re.M):
        return None
    return root


def build_from_source(source: Path, work: Path) -> Path:
    """``pip wheel --no-deps`` on a copy of the project's files (no build folders left in the tree)."""
    tree = work / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", *(p.name for p in source.glob("LICEN[CS]E*"))):
        if (source / name).is_file():
            shutil.copy2(source / name, tree / name)
    for package in PACKAGES:
        shutil.copytree(source / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = work / "dist"
    # Without build isolation when setuptools is here: nothing is fetched from an index.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "--quiet", "--wheel-dir", str(out),
               str(tree)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except subprocess.CalledProcessError as exc:
        raise WheelUnavailable(f"pip wheel failed on {source}: {(exc.stderr or exc.stdout).strip()[-2000:]}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WheelUnavailable(f"pip wheel could not run on {source}: {exc}") from None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise WheelUnavailable(f"pip wheel on {source} made {len(wheels)} wheels, not one")
    return wheels[0]


def repack_installed(work: Path, dist: importlib.metadata.Distribution | None = None) -> Path:
    """The installed distribution's own files (packages and metadata) packed back into a wheel."""
    try:
        dist = dist or importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise WheelUnavailable(f"{DIST_NAME} is neither installed nor run from its source tree") from None
    info = f"{DIST_NAME.replace('-', '_')}-{dist.version}.dist-info"
    skipped = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    entries: list[tuple[str, Path]] = []
    for file in dist.files or []:
        parts = Path(file).parts
        if not parts or parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
            continue  # console scripts (made again by pip at install) and caches
        if parts[0].endswith(".dist-info"):
            if parts[-1] in skipped:
                continue
            name = "/".join((info, *parts[1:]))
        elif parts[0] in PACKAGES:
            name = "/".join(parts)
        else:
            continue
        entries.append((name, Path(dist.locate_file(file))))
    if not any(name.startswith("runner/") for name, _ in entries):
        raise WheelUnavailable(f"the installed {DIST_NAME} lists no files of the runner package to pack")
    target = work / wheel_filename(dist.version)
    record = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, path in entries:
            data = path.read_bytes()
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return target
