"""Errors raised to users; shared by the compiler and the standalone runtime."""


class RlxError(Exception):
    """Base class of rlxc's own errors."""


class ShapeError(RlxError, ValueError):
    """A shape does not fit: the message names the op or input and both shapes."""


class NameLookupError(RlxError, KeyError):
    """An unknown, missing or unbound name; the message lists the valid ones."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ArtifactError(RlxError, RuntimeError):
    """A compiled artifact is missing, truncated, foreign or of another ABI version."""
