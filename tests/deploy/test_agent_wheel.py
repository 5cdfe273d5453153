"""The controller's own wheel (runner/controller/agent_wheel.py): built from its source tree, or packed back
from an installed distribution, both installable and holding the same files."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

from runner import __version__
from runner.controller.agent_wheel import AgentWheel, repack_installed, source_tree
from runner.distribution import DIST_NAME, wheel_filename


def _members(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if not n.endswith(("/RECORD", "/INSTALLER", "/REQUESTED"))}


def test_the_wheel_of_a_source_tree_and_of_its_installed_copy_hold_the_same_files(tmp_path):
    """Built once from the source tree (and kept: a second ask builds nothing), installed with pip, then
    repacked from that install: the repacked wheel has the built one's files and installs again."""
    assert source_tree() is not None  # the tests run from a checkout
    wheel = AgentWheel(tmp_path / "cache")
    built = wheel.path()
    assert built.name == wheel_filename() and built.parent == tmp_path / "cache"
    assert wheel.path() == built and built.stat().st_mtime_ns == wheel.path().stat().st_mtime_ns
    assert not list((tmp_path / "cache").glob(".build-*"))  # the build folder is gone

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(site), str(built)], check=True, timeout=300)
    dist = importlib.metadata.PathDistribution(site / f"{DIST_NAME.replace('-', '_')}-{__version__}.dist-info")
    (tmp_path / "work").mkdir()
    repacked = repack_installed(tmp_path / "work", dist)
    assert repacked.name == wheel_filename()
    assert _members(repacked) == _members(built)

    again = tmp_path / "again"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(again), str(repacked)], check=True, timeout=300)
    assert (again / "runner" / "providers" / "bootstrap.sh").is_file() and (again / "agents" / "main.py").is_file()


# Asks for the wheel as a controller process does, after its stdin closes (so that all start together), counting
# its own builds in the file named by argv[2]; prints the wheel's digest.
ASK = """
import hashlib, os, sys
from pathlib import Path
from runner.controller import agent_wheel

real_build = agent_wheel.build_from_source

def counted(source, work):
    with open(sys.argv[2], "a") as builds:
        builds.write(f"{os.getpid()}\\n")
    return real_build(source, work)

agent_wheel.build_from_source = counted
sys.stdin.read()
print(hashlib.sha256(agent_wheel.AgentWheel(Path(sys.argv[1])).path().read_bytes()).hexdigest())
"""


def test_processes_sharing_a_data_dir_build_the_wheel_once_and_serve_the_same_bytes(tmp_path):
    """The workers of `runner server --workers N` ask for the wheel at once: one builds it, the others wait for
    that build and serve its bytes; a process started later serves the same wheel without building again."""
    cache, builds = tmp_path / "agent-wheel", tmp_path / "builds"
    outputs = [tmp_path / f"asker-{n}" for n in range(3)]
    askers = [subprocess.Popen([sys.executable, "-c", ASK, str(cache), str(builds)], stdin=subprocess.PIPE,
                               stdout=open(out, "w"), stderr=subprocess.STDOUT) for out in outputs]
    for asker in askers:
        asker.stdin.close()  # all three ask now
    assert [asker.wait(timeout=600) for asker in askers] == [0, 0, 0], [o.read_text()[-2000:] for o in outputs]
    digests = {out.read_text().split()[-1] for out in outputs}  # the last line (logs go to stdout)
    assert len(digests) == 1, digests
    assert len(builds.read_text().splitlines()) == 1
    later = subprocess.run([sys.executable, "-c", ASK, str(cache), str(builds)], input="", capture_output=True,
                           text=True, timeout=600)
    assert later.returncode == 0 and later.stdout.split()[-1] in digests, later.stderr[-2000:]
    assert len(builds.read_text().splitlines()) == 1
    assert sorted(p.name for p in cache.iterdir()) == sorted([".lock", wheel_filename(), wheel_filename() + ".source"])


def test_a_wheel_built_from_other_files_is_built_again(tmp_path, monkeypatch):
    """A kept wheel is served only while the files it was built from are those of this process (an upgrade or an
    edited source tree changes them)."""
    from runner.controller import agent_wheel

    built = []

    def fake_build(source, work):
        built.append(source)
        wheel = work / "fake.whl"
        wheel.write_bytes(b"wheel %d" % len(built))
        return wheel

    monkeypatch.setattr(agent_wheel, "build_from_source", fake_build)
    monkeypatch.setattr(agent_wheel, "source_fingerprint", lambda: "first")
    assert AgentWheel(tmp_path).path().read_bytes() == b"wheel 1"
    assert AgentWheel(tmp_path).path().read_bytes() == b"wheel 1" and len(built) == 1
    monkeypatch.setattr(agent_wheel, "source_fingerprint", lambda: "second")
    assert AgentWheel(tmp_path).path().read_bytes() == b"wheel 2" and len(built) == 2
