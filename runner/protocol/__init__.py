"""The one definition of what the three processes say to each other: the controller, the agent on a node, and the
training library in the job's process (docs/protocol.md).

Standard library only (dataclasses and enums), so that every side may import it, the checkpoint library inside a
training process included. It imports nothing else of the project.

- ``environment``: the ``RUNNER_*`` variables the agent gives the job's process, and how an assignment maps to them;
- ``framing``: the control socket's newline-delimited JSON, read and written in one place for both ends;
- ``messages``: the typed messages on the control socket (``checkpoint``, ``stopping``, ``committed``...);
- ``actions``: what a heartbeat (and the other agent calls) answer the agent;
- ``events``: the kinds of report an agent posts, and why an attempt or an agent's job ended;
- ``states``: the states of a job and of a node, with their predicates;
- ``urls``: URLs as messages, logs and pages show them, their credentials as ``***`` (one ``redact`` for all).
"""
