"""One exception hierarchy: every error the project defines derives from runner.errors.RunnerError, keeps the
builtin base its callers catch, and the root can be imported without the controller."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import CloudError, ConfigError, InputError, RunnerError, Unreachable

ROOT = Path(__file__).resolve().parent.parent


def _defined_exceptions() -> list[tuple[str, str]]:
    """(module, class) of every class in runner/ and agents/ whose bases name an error or exception."""
    found = []
    for package in ("runner", "agents"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and any(
                        any(word in ast.unparse(base) for word in ("Error", "Exception", "Timeout", "Unreachable"))
                        for base in node.bases):
                    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                    found.append((module, node.name))
    return found


EXCEPTIONS = _defined_exceptions()


def test_the_scan_finds_the_project_exceptions():
    names = {name for _, name in EXCEPTIONS}
    assert {"SpecError", "ProviderError", "CheckpointError", "AgentConfigError", "DatabaseError"} <= names


@pytest.mark.parametrize("module, name", EXCEPTIONS)
def test_every_project_exception_derives_from_runner_error(module, name):
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:  # an optional dependency (a cloud SDK) missing here
        pytest.skip(f"{module}: {exc}")
    assert issubclass(cls, RunnerError), f"{module}.{name} does not derive from RunnerError"


def test_the_branches_say_what_failed_and_the_builtin_bases_are_kept():
    from agents.config import AgentConfigError
    from runner.checkpoint.errors import CheckpointConfigError
    from runner.client import BadRequest, ControllerUnreachable
    from runner.home import ConfigError as HomeConfigError
    from runner.providers.catalog.load import CatalogError
    from runner.providers.errors import NoCapacityError
    from runner.spec import SpecError
    from runner.state import DatabaseUnreachable

    assert HomeConfigError is ConfigError and issubclass(AgentConfigError, ConfigError)
    assert issubclass(SpecError, InputError) and issubclass(ConfigError, InputError)
    assert issubclass(BadRequest, InputError) and issubclass(NoCapacityError, CloudError)
    assert issubclass(ControllerUnreachable, Unreachable) and issubclass(DatabaseUnreachable, Unreachable)
    assert issubclass(CatalogError, ValueError) and issubclass(CheckpointConfigError, ValueError)


def test_the_root_needs_only_the_standard_library():
    """The agent and the checkpoint library import it on nodes that have no controller installed."""
    code = ("import sys; import runner.errors; "
            "print(sorted(m for m in sys.modules if m.startswith('runner') or m in ('pydantic', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    # the classes live at the bottom of the project, in the stdlib-only protocol package (its own errors derive
    # from them); nothing else of the project comes with them
    assert out.stdout.strip() == "['runner', 'runner.errors', 'runner.protocol', 'runner.protocol.errors']"
