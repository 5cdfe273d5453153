"""Secrets that every controller of one database shares: the admin token and the node secret.

The first controller to start creates each one (or adopts the one its data dir already holds, so an
existing installation keeps its token and its nodes' tokens stay valid); the others read it.
"""

from __future__ import annotations

import secrets

from .db import Database

ADMIN_TOKEN = "admin-token"
NODE_SECRET = "node-secret"


def shared_secret(db: Database, name: str, adopt: str | None = None) -> str:
    """The secret ``name``, created now (from ``adopt`` when given, else random) if the database has none."""
    with db.transaction() as tx:
        row = tx.one("SELECT value FROM controller_secrets WHERE name = ?", (name,))
        if row:
            return row["value"]
        value = adopt or secrets.token_urlsafe(32)
        tx.execute("INSERT INTO controller_secrets (name, value) VALUES (?, ?)", (name, value))
        return value
