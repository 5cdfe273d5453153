"""The controller: the HTTP API for the CLI and the agents, its settings and the daemon that serves it."""
