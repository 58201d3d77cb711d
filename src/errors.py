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


def user_error(error: BaseException | None) -> SuiteError | None:
    """The :class:`SuiteError` behind ``error`` (Hydra's instantiate wraps what targets raise; OmegaConf
    raises its own error while handling what a resolver raised, ``${image_folder:…}``'s)."""
    while error is not None and not isinstance(error, SuiteError):
        resolving = type(error).__name__ == "InterpolationResolutionError"
        error = error.__cause__ or (error.__context__ if resolving else None)
    return error


def message_of(error: BaseException) -> str:
    """The message a user should read. An error raised in a DataLoader worker comes back from
    torch with the worker's whole traceback as its message ("Caught DataError in DataLoader
    worker process 0. Original Traceback …"); this returns the original message alone."""
    text = str(error)
    if " in DataLoader worker process " in text and "Original Traceback" in text:
        marker = f"{type(error).__module__}.{type(error).__qualname__}: "
        at = text.rfind(marker)
        if at >= 0:
            return text[at + len(marker) :].strip()
    return text
