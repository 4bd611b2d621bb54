"""docs/configuration.md's tables of environment variables agree with the settings model:
each variable the model reads has a row naming its field (and, in the main table, its
default), and each variable a row gives a field is one the model reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stores.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
#: A variable as the tables write it (``TURNSTILE_<OPTION>``, a placeholder, is no variable).
VARIABLE = re.compile(r"`([A-Z][A-Z0-9_]*)`")
#: A field of the model as the tables write it.
FIELD = re.compile(r"`([a-z][a-z0-9_]*)`")


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table headed by ``header`` (up to the blank line)."""
    body = text.split(header + "\n", 1)[1].split("\n\n", 1)[0]
    return [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()[1:]
    ]


def documented() -> tuple[dict[str, str | None], dict[str, str]]:
    """Every variable the environment tables name, with the field they give it (``None``:
    read by OpenTelemetry itself, not by the model), and the main table's default cells."""
    text = DOC.read_text()
    fields: dict[str, str | None] = {}
    defaults: dict[str, str] = {}
    for variable_cell, field_cell, default, _used_by, _meaning in table_rows(
        text, "| variable | setting | default | used by | meaning |"
    ):
        for variable, field in zip(
            VARIABLE.findall(variable_cell), FIELD.findall(field_cell), strict=True
        ):
            fields[variable] = field
            defaults[variable] = default
    for variable_cell, field_cell, _meaning in table_rows(text, "| variable | setting | meaning |"):
        names, given = VARIABLE.findall(variable_cell), FIELD.findall(field_cell)
        assert len(given) in (0, len(names)), f"{names}: one setting per variable, or none"
        for variable, field in zip(names, given or [None] * len(names), strict=True):
            fields[variable] = field
    return fields, defaults


def shown(value: Any) -> str:
    """A default as the main table's ``default`` column starts."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def test_every_setting_has_a_row_naming_its_field() -> None:
    """A variable the model reads but the doc does not list fails here, and so does a row
    that gives it another field."""
    fields, _ = documented()
    missing = {v: f for v, f in Settings.variables().items() if fields.get(v) != f}
    assert missing == {}, "docs/configuration.md lacks (or misnames) these settings"


def test_every_row_with_a_field_is_a_setting_of_the_model() -> None:
    """A row naming a variable or a field the model lacks fails here."""
    fields, _ = documented()
    unknown = {v: f for v, f in fields.items() if f is not None and v not in Settings.variables()}
    assert unknown == {}, "docs/configuration.md names settings the model does not have"
    read_by_model = {v for v in fields if fields[v] is None} & set(Settings.variables())
    assert read_by_model == set(), "rows say the SDK reads these, but the model does"


def test_the_main_table_shows_each_default_as_the_model_has_it() -> None:
    """The ``default`` column starts with the field's default (``none`` for no value)."""
    _, defaults = documented()
    wrong = {
        variable: (cell, shown(Settings.model_fields[field].default))
        for variable, field in Settings.variables().items()
        if variable in defaults
        and not (cell := defaults[variable]).startswith(shown(Settings.model_fields[field].default))
    }
    assert wrong == {}
