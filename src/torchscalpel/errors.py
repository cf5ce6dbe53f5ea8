"""Errors a user can cause, each carrying one sentence that says what to change.

The CLI turns :class:`UsageError` into ``scalpel: error: <sentence>`` and exit code 2; any other
:class:`ScalpelError` into the same line and exit code 1. Library code raises these instead of
logging and re-raising, so a user never sees a bare traceback for their own mistake.
"""

from __future__ import annotations


class ScalpelError(Exception):
    """A failure with a message written for the user (one sentence, names what to change)."""

    exit_code: int = 1


class UsageError(ScalpelError):
    """Bad command-line input: a missing path, a malformed spec, a bad flag combination."""

    exit_code = 2


class RecordVersionError(ScalpelError):
    """A record or bundle written by a newer, incompatible torchscalpel."""

    exit_code = 2
