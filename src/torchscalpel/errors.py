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


class ArgumentError(ValueError):
    """A bad value for an argument of the library, in a sentence that names the argument as the caller
    wrote it (``warmup must be an integer >= 0, not -1``).

    ``template`` names each argument it mentions as ``{name}``, every other brace doubled (:func:`literal`).
    ``str()`` reads with the argument names; :meth:`worded` with other words for them: the CLI passes its flags
    (``--warmup must be ...``), so the library and the command line give the same sentence in their own terms.
    A ``ValueError``, so ``except ValueError`` catches it as it caught every validation error before.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.worded())

    def worded(self, names: dict[str, str] | None = None) -> str:
        """The sentence, each argument called by its name in ``names`` (its own name when absent)."""
        return self.template.format_map(_Names(names or {}))


class _Names(dict[str, str]):
    """``str.format_map``'s mapping: an argument missing from it is called by its own name."""

    def __missing__(self, key: str) -> str:
        return key


def literal(value: object) -> str:
    """``value`` as text to put inside an :class:`ArgumentError` template (its braces doubled)."""
    return str(value).replace("{", "{{").replace("}", "}}")
