"""Jinja2 templates of Markdown sections: the package's own (``data/templates/``) and a user's (a claims file's
``template:``), both rendered in a sandbox.

A template is text from a stranger's repository as much as from the package, so every one is rendered the same way:
``jinja2.sandbox.SandboxedEnvironment`` (no attribute of Python's internals, no calls that change the data), with
``StrictUndefined`` (a misspelt name is an error naming it, never an empty cell) and a loader that finds nothing, so
that ``{% include %}``, ``{% import %}`` and ``{% extends %}`` reach no file at all. Text from the data goes through
the ``md`` filter, which escapes what Markdown or HTML would read as markup; ``code`` writes a code span.
"""

from __future__ import annotations

import html
import re
from importlib import resources
from pathlib import Path

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from ..core.errors import CrashlineError
from . import markdown
from .doc import Code

MAX_TEMPLATE_BYTES = 256 << 10
_MARKUP = re.compile(r"([\\`*_|\[\]#])")


class TemplateError(CrashlineError, ValueError):
    """A template that cannot be read or rendered; the message names it, the line and why."""


def md(value) -> str:
    """``value`` as literal Markdown text on one line: HTML's ``<``, ``>`` and ``&`` as entities, and the characters
    Markdown reads as markup (pipes, backticks, asterisks, underscores, brackets, ``#``, backslashes) escaped, so
    that a label cannot split a table cell, open a code span or emphasis, or become a tag upstream."""
    text = html.escape(str(value), quote=False).replace("\r", "").replace("\n", " ")
    return _MARKUP.sub(r"\\\1", text)


def code(value, cell: bool = False) -> str:
    """``value`` as a code span with as many backticks as it needs (``cell``: inside a table cell, pipes escaped)."""
    return markdown.inline(Code(str(value)), cell)


def environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        loader=jinja2.FunctionLoader(lambda name: None),  # every other template is "not found"
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
    )
    env.filters["md"] = md
    env.filters["code"] = code
    return env


def package_template(name: str) -> str:
    return resources.files("crashline").joinpath("data", "templates", name).read_text()


def user_template(path: str | Path) -> str:
    """A user's template file: a plain file, UTF-8, of at most MAX_TEMPLATE_BYTES."""
    path = Path(path)
    if not path.is_file():
        raise TemplateError(f"template {path}: no such file")
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise TemplateError(f"template {path}: larger than {MAX_TEMPLATE_BYTES >> 10} KiB")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TemplateError(f"template {path}: not UTF-8 text ({exc})") from None


def render(text: str, where: str, context: dict) -> str:
    """``text`` (a template, named ``where`` in errors) rendered with ``context``."""
    try:
        return environment().from_string(text).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"template {where}: reads no other file ({exc.name}); put what it needs in it") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"template {where}, line {exc.lineno}: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(f"template {where}: {exc} (templates run in a sandbox)") from None
    except jinja2.TemplateError as exc:  # an undefined name, an include without a loader
        raise TemplateError(f"template {where}: {exc}") from None
