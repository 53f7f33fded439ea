"""Errors the user can act on: each carries a one-line message and a hint.

The CLI prints `error: <message>` and `hint: <hint>` and exits non-zero; tracebacks only with
LUCEBOX_DEBUG=1. Library code raises these (never prints); anything else is a bug.
"""

from __future__ import annotations


class LuceboxError(Exception):
    """Base class: `message` says what went wrong, `hint` what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(LuceboxError):
    """Bad arguments or option combinations."""

    exit_code = 2


class ModelNotFound(LuceboxError):
    """An alias, repo or path that does not resolve, or weights missing from the cache."""


class DownloadError(LuceboxError):
    """The hub could not be reached, a transfer failed, or a checksum did not match."""


class BadModelFile(LuceboxError):
    """A checkpoint or GGUF file that is corrupt, truncated, or not what it claims to be."""


class UnsupportedModel(LuceboxError):
    """A valid file of an architecture or tensor type lucebox does not handle."""


class ProfileError(LuceboxError):
    """A hardware profile that is unknown or fails validation."""


class ProfileMismatch(LuceboxError):
    """A built engine whose compiled arch or ABI differs from what this GPU/profile needs."""


class EngineUnavailable(LuceboxError):
    """The requested engine cannot run here (no GPU, no driver, not built)."""


class OutOfMemory(LuceboxError):
    """The memory plan does not fit the card."""


class BuildError(LuceboxError):
    """Building the CUDA library failed."""
