"""Controller state: database access and schema migrations."""

from .db import Database, Tx, open_database, redact
from .errors import DatabaseError, DatabaseUnreachable, SchemaTooNew
from .store import Store

__all__ = ["Database", "DatabaseError", "DatabaseUnreachable", "SchemaTooNew", "Store", "Tx", "open_database",
           "redact"]
