"""Errors the toolkit raises on bad input; the CLI turns each into one line and a non-zero exit."""


class StabilityError(Exception):
    """Base class: a user-facing error whose message is one clear line."""


class ConfigError(StabilityError, ValueError):
    """An unknown key or a value outside the allowed ones."""


class CheckpointError(StabilityError):
    """A file that is not a loadable `stability` checkpoint."""


class DataError(StabilityError):
    """A dataset file that is missing, malformed, or inconsistent."""


class DivergenceError(StabilityError):
    """Training produced a non-finite loss or gradient."""


class OutputError(StabilityError, OSError):
    """An output location that cannot be written (checked before work starts, or a write that failed)."""


class MissingExtraError(StabilityError, ImportError):
    """An optional package (an extra of ``pyproject.toml``, :mod:`stability.extras`) that is not installed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (as SIGINT raises KeyboardInterrupt) so that it unwinds as Ctrl-C does:
    locks released, temporary files removed (stability.train.loop.sigterm_unwinds). The CLI exits 143 on it."""


#: the exit status of a command ended by SIGTERM (128 + 15, as the shell reports a process killed by it)
EXIT_TERMINATED = 143


def first_line(exc: BaseException | str, default: str = "") -> str:
    """The first non-empty line of an exception's message (or of a text); ``default``, else the exception's class
    name, when it has none. The one way a foreign error becomes part of a one-line message."""
    text = str(exc).strip()
    if text:
        return text.splitlines()[0].strip()
    return default or (type(exc).__name__ if isinstance(exc, BaseException) else "")
