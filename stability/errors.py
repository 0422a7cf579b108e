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
