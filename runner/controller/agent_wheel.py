"""The wheel a cloud node installs the runner from: this controller's own version, served to its nodes.

A node never takes the runner from a public package index (where another project may hold the name, or a
different version sits): its bootstrap script fetches ``GET /v1/agent/wheel`` with its own token and
installs that file. The wheel is built at the first request and kept under the data dir, once for every
process that serves it: the workers of `runner server --workers N` (and controllers on one machine sharing a data
dir) take a file lock there, so one builds while the others wait, then serve its wheel; a wheel is replaced by an
atomic rename, so none ever serves half of one. A wheel kept there is served again, by a later process too, while
the files it was built from are unchanged (their names, sizes and modification times, recorded beside it); an
upgrade or an edited source tree builds it again. It is built:

- from the source tree the controller runs from (a checkout, or an editable install): ``pip wheel --no-deps``
  on a copy of it, so the tree itself gains no build folders;
- otherwise from the installed distribution: its files and metadata packed back into a wheel.

The wheel holds the runner alone; its dependencies come from the node's configured package index.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import stat as stat_module
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
LOCK_FILE = ".lock"
SOURCE_SUFFIX = ".source"  # beside the wheel: the fingerprint of the files it was built from


class WheelUnavailable(RunnerError):
    """The controller cannot produce its wheel; the message says why."""


class AgentWheel:
    """This controller's wheel, built on first use into ``cache_dir`` (one build at a time, among threads and among
    processes), or taken from there when a process before built it from the same files."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = Path(cache_dir)
        self._lock = threading.Lock()
        self._path: Path | None = None

    def path(self) -> Path:
        with self._lock:
            if self._path is None or not self._path.exists():
                self._path = self._kept_or_built()
            return self._path

    def _kept_or_built(self) -> Path:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        target = self.cache_dir / wheel_filename()
        recorded = target.with_name(target.name + SOURCE_SUFFIX)
        with open(self.cache_dir / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed: another process building, we wait for it
            fingerprint = source_fingerprint()
            if target.exists() and _read(recorded) == fingerprint:
                log.info("agent wheel kept", path=str(target), size=target.stat().st_size)
                return target
            self._build(target)
            _write_atomically(recorded, fingerprint)
        return target

    def _build(self, target: Path) -> None:
        with tempfile.TemporaryDirectory(dir=self.cache_dir, prefix=".build-") as work:
            source = source_tree()
            built = build_from_source(source, Path(work)) if source else repack_installed(Path(work))
            os.replace(built, target)  # atomic: a process serving the wheel never sees half of one
        log.info("agent wheel ready", path=str(target), size=target.stat().st_size,
                 source=str(source) if source else "installed distribution")


def source_fingerprint() -> str:
    """What the wheel would be built from, in one digest: every file of the packages (name, size and modification
    time) and the project files beside them in a source tree, with the version."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(wheel_filename().encode())
    files = [root / name for name in ("pyproject.toml", "README.md")]
    for package in PACKAGES:
        files += sorted(f for f in (root / package).rglob("*") if "__pycache__" not in f.parts and f.suffix != ".pyc")
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        if stat_module.S_ISREG(stat.st_mode):
            digest.update(f"{file.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
