"""Reading YAML files and checking them against the package's schemas, with errors that name the key
and the bad value: what the config and the claims files share."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ..core import settings as settings_mod
from ..core.errors import CrashlineError

DATA = Path(__file__).parents[1] / "data"
SCHEMA_NAME = "schema.yaml"


class ConfigError(CrashlineError, ValueError):
    """The configuration is invalid; the message names the key and the bad value."""


def load_schema(name: str = SCHEMA_NAME) -> dict:
    """A schema shipped inside the package (so a wheel has it too)."""
    return yaml.safe_load((DATA / name).read_text())


def fill_defaults(schema: dict, instance: Any) -> Any:
    """Fill ``default`` values from the schema into ``instance`` (objects and array items)."""
    if isinstance(instance, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in instance and "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                instance[key] = fill_defaults(sub, instance[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in instance:
                if key not in schema.get("properties", {}):
                    instance[key] = fill_defaults(extra, instance[key])
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [fill_defaults(schema["items"], item) for item in instance]
    return instance


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def _child(path: str, key: Any) -> str:
    return str(key) if path == "(top level)" else f"{path}.{key}"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (an unknown key may hold a whole mapping)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


TYPE_WORDS = {
    "object": "a mapping (KEY: VALUE)",
    "array": "a list",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
}


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _reason(e: jsonschema.ValidationError) -> str:
    """What is wrong, in words: the type expected, the alternatives of a oneOf, the description of a pattern."""
    if _not_finite(e.instance) and e.validator in ("type", "oneOf", "anyOf"):
        return f"expected a finite number, not {e.instance!r} (YAML's .nan and .inf are no count, time or speed)"
    if e.validator == "type":
        types = [e.validator_value] if isinstance(e.validator_value, str) else e.validator_value
        return "expected " + " or ".join(TYPE_WORDS.get(t, t) for t in types)
    if e.validator in ("oneOf", "anyOf"):
        said = [sub.get("description") for sub in e.validator_value]
        return "expected " + " or ".join(said) if all(said) else "; or ".join(sub.message for sub in e.context)
    if e.validator == "pattern" and "description" in e.schema:
        return f"expected {e.schema['description']}"
    return e.message


def _error_lines(e: jsonschema.ValidationError, prefix: str) -> list[str]:
    path = _key_path(e)
    if e.validator == "additionalProperties" and e.validator_value is False:
        known = list(e.schema.get("properties", {}))
        return [
            f"{prefix} {_child(path, key)} = {short_repr(value)}: unknown key; {settings_mod.did_you_mean(key, known)}"
            for key, value in e.instance.items()
            if key not in known
        ]
    if "propertyNames" in e.relative_schema_path:
        return [f"{prefix} {path}: the name {e.instance!r} is not allowed; {_reason(e)}"]
    return [f"{prefix} {path} = {short_repr(e.instance)}: {_reason(e)}"]


def _whole_number(checker, instance) -> bool:
    """An integer is an int: JSON Schema counts 2.0 as one, and a job then fails on ``range(2.0)``."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _finite_number(checker, instance) -> bool:
    """A number is finite: YAML's .nan and .inf are floats that JSON Schema counts as numbers (NaN passes every
    minimum and maximum), and every job would then fail on them. The one place for every number of the config and
    of the claims files; the schemas give each number its bound (tests/test_hostile_inputs.py checks they do)."""
    return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)


_STRICT = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _whole_number, "number": _finite_number}
    ),
)


def schema_errors(instance, schema: dict, prefix: str) -> list[str]:
    """One line per schema violation, naming the key and the bad value (and a near miss of an unknown key)."""
    validator = _STRICT(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    return [line for e in errors for line in _error_lines(e, prefix)]


class _DuplicateKeyError(yaml.MarkedYAMLError):
    """A key written twice in one mapping (PyYAML would keep the last one silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key written twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges; keys written after it override on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first
            except TypeError:
                continue  # an unhashable key: the constructor below says so
            if seen:
                raise _DuplicateKeyError(
                    problem=f"duplicate key {key!r} (first at line {first[key].line + 1}); "
                    "a key may appear once in a mapping",
                    problem_mark=key_node.start_mark,
                )
            first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A parser error on one line: where, what, and where the construct it broke began."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and start.line != mark.line:
        text += f" ({context} at line {start.line + 1})"
    return text


def read_yaml(path: Path, what: str, error: type[ConfigError] = ConfigError) -> Any:
    """A YAML file's content; a missing, unreadable or malformed file, or a key written twice in one
    mapping, raises ``error`` naming ``what``, the path and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise error(f"{what} {path} is not valid YAML: {_yaml_problem(exc)}") from None


def check_setting(key: str, name: str, value: Any, models) -> None:
    """A known setting with a value of its kind, a draft_model among ``models``; SettingsError "KEY = VALUE: why"."""
    try:
        settings_mod.check_value(name, value)
    except settings_mod.SettingsError as exc:
        raise settings_mod.SettingsError(f"{key} = {short_repr(value)}: {exc.reason}", exc.reason) from None
    if name == "draft_model" and value is not None and value not in models:
        reason = f"no such model; models are {', '.join(sorted(models))}"
        raise settings_mod.SettingsError(f"{key} = {value!r}: {reason}", reason)
