"""The one exception a user meets: a mistake they can fix, with what to do about it.

Everything the suite raises for bad input (an unknown name, a missing data folder, an
incompatible combination) is a :class:`SuiteError`; ``python -m src.run`` prints its
message alone, without a traceback, and exits with status 2 before any work is lost.
"""


class SuiteError(Exception):
    """Bad input: the message says what was wrong and what to do."""


class ConfigError(SuiteError):
    """A configuration that cannot run: an incompatible combination, a wrong value."""


class DataError(SuiteError):
    """Data that cannot be read: missing folders or files, a corrupt or empty file."""
