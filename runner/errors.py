"""The root of every error runner raises, and its branches (standard library only: the agent and the
checkpoint library import it without the controller).

``except RunnerError`` catches anything the project raises on purpose; the branches say what kind of failure
it is, and so what a command does with it:

- ``InputError``: bad input (a job file, an argument, a trace file); the CLI exits 2.
  - ``ConfigError``: a configuration file or setting (``config.yaml``, the agent's config); the CLI exits 2.
- ``CloudError``: a provider or its cloud refused or failed (``runner.providers.errors.ProviderError``).
- ``Unreachable``: a service we need did not answer: the controller (``runner.client.ControllerUnreachable``,
  exit 3) or the database (``runner.state.DatabaseUnreachable``).
- ``runner.checkpoint.errors.CheckpointError``: checkpointing or restoring failed.

Each project exception keeps its own name and the builtin base its callers catch (``CatalogError`` is still a
``ValueError``): ``class CatalogError(InputError, ValueError)``.
"""

from __future__ import annotations

from .protocol.errors import CloudError, ConfigError, InputError, RunnerError, Unreachable

__all__ = ["CloudError", "ConfigError", "InputError", "RunnerError", "Unreachable"]
