"""How `pytest -n N` hands out the tests (tests/conftest.py plugs this in).

- The slowest start first (`start_order`), so the run never ends on one long test alone.
- The tests of a module that share a module-scoped fixture (a scenario run once and asserted by several
  tests, a controller, a server) are one unit of work, so that fixture is set up once, on one worker; xdist's
  default would set it up again on every worker that draws one of them. On the controller's two databases,
  each database's half is its own unit. Every other test is a unit of its own.

xdist's own `--dist loadgroup` would do the grouping from marks, but it does not group under pytest 9.2 (it
renames node ids, which pytest no longer lets it do), so the modules are found here from their source.
"""

from __future__ import annotations

import ast
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

# Folders whose tests start several torch processes (minutes on a busy machine): started first.
SLOW_FOLDERS = ("e2e", "integrations")
# Module-scoped fixtures that only carry a parameter (no state worth sharing): they group no tests.
MODULE_SCOPED_CARRIERS = ("backend", "module_controller_db")
DATABASES = ("sqlite", "postgres")


def start_order(item, tests: Path) -> tuple[int, float]:
    """Lower starts earlier: a test whose author raised its timeout above the default (the higher, the earlier: the
    authors raised it for the longest), then the folders whose tests start torch processes and the tests marked
    `start_early` elsewhere, then those that start a controller, then the rest."""
    marker = item.get_closest_marker("timeout")
    default = float(item.config.getini("timeout") or 0)
    if marker and marker.args and float(marker.args[0]) > default:
        return 0, -float(marker.args[0])
    if item.get_closest_marker("start_early") or (
            item.path.is_relative_to(tests) and item.path.relative_to(tests).parts[0] in SLOW_FOLDERS):
        return 1, 0
    if {"controller", "controller_db", "module_controller_db"} & set(item.fixturenames):
        return 2, 0
    return 3, 0


def _module_fixtures(tree: ast.Module) -> set[str]:
    """The names of the module-scoped fixtures a file defines."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(_is_module_fixture(d) for d in node.decorator_list):
            names.add(node.name)
    return names - set(MODULE_SCOPED_CARRIERS)


def _is_module_fixture(decorator: ast.expr) -> bool:
    return (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "fixture"
            and any(k.arg == "scope" and getattr(k.value, "value", None) == "module" for k in decorator.keywords))


def shared_scenario_modules(tests: Path, rootdir: Path) -> set[str]:
    """The test modules (paths as in node ids) that define a module-scoped fixture or import one from a helper
    module beside them."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in tests.rglob("*.py")}
    defined = {path.stem: _module_fixtures(tree) for path, tree in trees.items()}
    shared = set()
    for path, tree in trees.items():
        if not path.name.startswith("test_"):
            continue
        imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                    for alias in node.names if alias.name in defined.get((node.module or "").split(".")[-1], ())}
        if defined[path.stem] or imported:
            shared.add(path.relative_to(rootdir).as_posix())
    return shared


class SharedScenarioScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the units above, handed out in collection order (slowest first)."""

    def __init__(self, config, log=None, shared: set[str] = frozenset()):
        super().__init__(config, log)
        self.shared = shared

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module not in self.shared:
            return nodeid
        database = next((name for name in DATABASES if f"[{name}" in nodeid), "")
        return f"{module}[{database}]"
