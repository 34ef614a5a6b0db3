"""The exit statuses of ``crashline``, in one place: what a script can tell from the status alone (#41 item 5).
``crashline --help`` lists them (``epilog``), and so does docs/tune.md's "Exit codes"."""

from __future__ import annotations

import signal
import textwrap
from enum import IntEnum


class Exit(IntEnum):
    ANSWERED = 0
    ERROR = 2
    NOTHING_SURVIVED = 3
    REGRESSED = 4


MEANING = {
    Exit.ANSWERED: "done: tune has an answer, recheck and compare found no regression",
    Exit.ERROR: "bad input or an error, said in one line on stderr (a usage error too)",
    Exit.NOTHING_SURVIVED: "tune: nothing survived, a model (on one of its machines) has no recommendation",
    Exit.REGRESSED: "recheck: a configuration now fails or is slower beyond the noise (on the same build too); "
    "compare: a run is slower than the first run beyond the noise, or has no answer where the first has one",
}
# Not crashline's own choice: the shell's 128 + the signal's number.
SIGNALLED = {
    128 + signal.SIGTERM: "stopped by SIGTERM (tune, recheck: the same command resumes)",
    128 + signal.SIGPIPE: "its reader closed stdout (`crashline plan | head -1`)",
}


def epilog() -> str:
    """The statuses, as ``crashline --help`` ends."""
    lines = [
        textwrap.fill(text, 100, initial_indent=f"  {int(code):<4}", subsequent_indent=" " * 6)
        for code, text in (*MEANING.items(), *SIGNALLED.items())
    ]
    return "exit status:\n" + "\n".join(lines)


class Said(list):
    """The lines a verb prints, with the status it ends with."""

    def __init__(self, lines=(), status: Exit = Exit.ANSWERED):
        super().__init__(lines)
        self.status = status

    def after(self, *first: str) -> Said:
        """These lines with ``first`` before them, the status kept."""
        return Said([*first, *self], self.status)


def of_answers(answers: list[dict]) -> Exit:
    """tune's status from its recommendation.json: NOTHING_SURVIVED where a model has no winner (or none at all)."""
    return Exit.ANSWERED if answers and all(a.get("winner") for a in answers) else Exit.NOTHING_SURVIVED


def of_recheck(rows: list[dict]) -> Exit:
    """recheck's status from its rows (tables.recheck.compare)."""
    from ..tables.recheck import regressed

    return Exit.REGRESSED if regressed(rows) else Exit.ANSWERED


def of_compare(rows: list[dict]) -> Exit:
    """compare's status from its rows (tables.compare.compare)."""
    from ..tables.compare import regressed

    return Exit.REGRESSED if regressed(rows) else Exit.ANSWERED
