"""The state layer's errors; each message names the database (never its password) and the fix."""

from ..errors import InputError, RunnerError, Unreachable


class DatabaseError(RunnerError):
    """The database cannot be opened or used."""

    exit_code = 1


class UnsupportedDatabaseURL(DatabaseError, InputError):
    """A database URL of a kind runner does not use (``mysql://``): bad input (CLI exit 2)."""

    exit_code = 2


class DatabaseUnreachable(DatabaseError, Unreachable):
    """The database server cannot be reached or refuses the connection (CLI exit 3)."""

    exit_code = 3


class SchemaTooNew(DatabaseError):
    """The database was migrated by a newer runner than this one."""
