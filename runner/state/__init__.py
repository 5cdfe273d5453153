"""Controller state: database access and schema migrations."""

from .db import Database, DatabaseError, Tx, open_database
from .store import Store

__all__ = ["Database", "DatabaseError", "Store", "Tx", "open_database"]
