"""The one base of crashline's own errors."""

from __future__ import annotations


class CrashlineError(Exception):
    """An error whose message says what is wrong (the key or file, the value) and how to fix it: every verb
    prints it as it is, one line and exit status 2, without a traceback. Each kind keeps its own class (and
    the built-in base it had, so that ``except ValueError`` still holds); anything else that escapes a verb is
    a crashline bug and is printed with its type."""
