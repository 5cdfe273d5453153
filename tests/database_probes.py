"""A database wrapper for tests that count how many write transactions some code opens."""

from __future__ import annotations


class CountingTransactions:
    """The store's database, counting the write transactions opened through it."""

    def __init__(self, db):
        self.db, self.count = db, 0

    def transaction(self, **kwargs):
        self.count += 1
        return self.db.transaction(**kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)
