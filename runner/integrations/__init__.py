"""runner.integrations: the runner's checkpoints for training frameworks (docs/integrations.md).

* ``runner.integrations.transformers``: ``RunnerCallback`` for the Hugging Face Trainer, ``last_checkpoint()``.
* ``runner.integrations.lightning``: ``RunnerCallback`` for ``lightning.Trainer``, ``last_checkpoint()``.

Each framework writes its own checkpoint; ``runner.checkpoint`` decides when, commits that folder to both
tiers with checksums, keeps ``keep`` of them, serves notices and the resume drill, and finds the newest
one that verifies. Nothing here is imported by ``runner.checkpoint`` itself.
"""
