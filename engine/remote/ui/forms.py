"""Decision forms generated from an interrupt's output schema, and reading them back.

An object schema becomes one field per property: booleans are a Yes/No choice, enums a choice
of their values, strings a text box, numbers and integers a number box; a property that may be
``null`` (pydantic's ``X | None``) is its non-null type, left empty for ``null``. Anything else
(nested objects, arrays, unions) is a JSON text box, as is a schema that is no object, or none
at all. Reading a submitted form checks what the form itself can know (required fields, numbers,
JSON, enum members, lengths and bounds) and reports each problem on its field; the engine then
checks the whole answer against the schema when the decision is recorded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = ["Choice", "DecisionForm", "FormField", "FormReading", "build_form"]

FieldKind = Literal["boolean", "choice", "text", "textarea", "number", "integer", "json"]

#: Words in a string property's name or title that ask for a multi-line box.
_LONG_TEXT_WORDS = ("comment", "feedback", "reason", "note", "message", "details", "description")
#: Up to this many enum members are radio buttons; more are a drop-down list.
_MAX_RADIO_CHOICES = 4
#: The name of the single field of a schema that is not an object.
ROOT_FIELD = "answer"


@dataclass(frozen=True)
class Choice:
    """One option of a choice: the JSON text submitted, and what the approver reads."""

    value: str
    label: str


@dataclass(frozen=True)
class FormField:
    """One input of a decision form, with what was submitted and its problem, if any."""

    #: The property it fills (``""`` for a schema that is no object: the whole answer).
    name: str
    label: str
    kind: FieldKind
    required: bool
    description: str | None = None
    nullable: bool = False
    choices: tuple[Choice, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    #: The text shown in the input: the submitted text, or the schema's default.
    value: str = ""
    error: str | None = None
    #: What the input's name and id start with (two forms on one page need different ones).
    prefix: str = "field"

    @property
    def input_name(self) -> str:
        """The form field name (prefixed, so no property can clash with the form's own)."""
        return f"{self.prefix}.{self.name}" if self.name else f"{self.prefix}.{ROOT_FIELD}"

    @property
    def input_id(self) -> str:
        """An HTML id for the input (its label and error message point at it)."""
        safe = "".join(c if c.isalnum() else "-" for c in self.name or ROOT_FIELD)
        return f"{self.prefix}-{safe}"

    @property
    def radios(self) -> bool:
        """Whether the choices are radio buttons (else a drop-down list)."""
        return self.kind == "boolean" or len(self.choices) <= _MAX_RADIO_CHOICES


@dataclass(frozen=True)
class DecisionForm:
    """The fields of a decision form; ``root`` when one field holds the whole answer."""

    fields: tuple[FormField, ...]
    root: bool = False
    #: A problem with the answer as a whole (the engine's schema check), shown above the form.
    error: str | None = None

    @property
    def problems(self) -> list[tuple[str, str]]:
        """``(input id, message)`` of each field with a problem (the error summary)."""
        return [(f.input_id, f"{f.label}: {f.error}") for f in self.fields if f.error]

    def read(self, submitted: Mapping[str, str]) -> FormReading:
        """The answer the submitted form gives, or the form with its problems marked."""
        answer: dict[str, Any] = {}
        checked: list[FormField] = []
        for item in self.fields:
            text = submitted.get(item.input_name, "")
            value, error = _read_field(item, text)
            checked.append(replace(item, value=text, error=error))
            if error is None and value is not _OMITTED:
                answer[item.name] = value
        form = replace(self, fields=tuple(checked))
        if form.problems:
            return FormReading(form=form, ok=False)
        if self.root:
            return FormReading(form=form, ok=True, answer=answer.get(""))
        return FormReading(form=form, ok=True, answer=answer)

    def filled(self, values: Any, *, prefix: str) -> DecisionForm:
        """The same form with each field showing ``values``' property (the arguments an
        edit form starts from), its inputs named with ``prefix``."""
        current = values if isinstance(values, dict) else {}
        return replace(
            self,
            fields=tuple(
                replace(
                    item,
                    prefix=prefix,
                    value=_shown(item, current[item.name]) if item.name in current else item.value,
                )
                for item in self.fields
            ),
        )

    def with_error(self, message: str) -> DecisionForm:
        """The same form with a problem of the whole answer."""
        return replace(self, error=message)


@dataclass(frozen=True)
class FormReading:
    """What reading a submitted form gave: the answer when ``ok``, else the marked form."""

    form: DecisionForm
    ok: bool
    answer: Any = None


class _Omitted:
    """An optional field left empty: the property is left out of the answer."""


_OMITTED: Any = _Omitted()


def build_form(schema: Mapping[str, Any] | None) -> DecisionForm:
    """The form for answers matching ``schema`` (a JSON schema; ``None``: any JSON)."""
    if schema is None:
        return DecisionForm(fields=(_json_field("", "Answer (JSON)", required=True),), root=True)
    resolved = _resolve(schema, schema)
    properties = resolved.get("properties")
    if resolved.get("type") != "object" or not isinstance(properties, dict) or not properties:
        single = _field("", resolved, schema, required=True)
        return DecisionForm(fields=(replace(single, label=single.label or "Answer"),), root=True)
    required = set(resolved.get("required") or ())
    return DecisionForm(
        fields=tuple(
            _field(name, spec, schema, required=name in required)
            for name, spec in properties.items()
            if isinstance(spec, dict)
        )
    )


def _resolve(spec: Mapping[str, Any], document: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec`` with a local ``$ref`` (``#/$defs/X``) replaced by its target, merged with the
    keywords beside it (pydantic puts ``default`` and ``title`` there)."""
    ref = spec.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return spec
    target: Any = document
    for part in ref[2:].split("/"):
        target = target.get(part) if isinstance(target, dict) else None
    if not isinstance(target, dict):
        return spec
    merged = {**target, **{k: v for k, v in spec.items() if k != "$ref"}}
    return _resolve(merged, document) if "$ref" in target else merged


def _nullable(
    spec: Mapping[str, Any], document: Mapping[str, Any]
) -> tuple[Mapping[str, Any], bool]:
    """The non-null alternative of ``anyOf: [X, {type: null}]`` (and whether null is allowed)."""
    options = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(options, list) and len(options) == 2:
        non_null = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(non_null) == 1 and isinstance(non_null[0], dict):
            inner = _resolve(non_null[0], document)
            outer = {k: v for k, v in spec.items() if k not in ("anyOf", "oneOf")}
            return {**inner, **outer}, True
    kind = spec.get("type")
    if isinstance(kind, list) and "null" in kind and len(kind) == 2:
        other = next(k for k in kind if k != "null")
        return {**spec, "type": other}, True
    return spec, False


def _field(
    name: str, raw: Mapping[str, Any], document: Mapping[str, Any], *, required: bool
) -> FormField:
    spec, nullable = _nullable(_resolve(raw, document), document)
    label = str(spec.get("title") or name.replace("_", " ").strip().capitalize() or "Answer")
    description = spec.get("description") if isinstance(spec.get("description"), str) else None
    default = spec.get("default", _OMITTED)
    shown = "" if default is _OMITTED or default is None else _as_text(default)
    base = FormField(
        name=name,
        label=label,
        kind="json",
        required=required,
        description=description,
        nullable=nullable,
        value=shown,
    )
    enum = spec.get("enum")
    kind = spec.get("type")
    if isinstance(enum, list) and enum:
        choices = tuple(Choice(json.dumps(v), str(v)) for v in enum if v is not None)
        shown = json.dumps(default) if default is not _OMITTED and default is not None else ""
        return replace(base, kind="choice", choices=choices, value=shown)
    if kind == "boolean":
        choices = (Choice("true", "Yes"), Choice("false", "No"))
        return replace(base, kind="boolean", choices=choices)
    if kind in ("number", "integer"):
        return replace(
            base,
            kind=kind,
            minimum=_number(spec.get("minimum")),
            maximum=_number(spec.get("maximum")),
        )
    if kind == "string":
        long_text = any(word in f"{name} {label}".lower() for word in _LONG_TEXT_WORDS)
        max_length = spec.get("maxLength") if isinstance(spec.get("maxLength"), int) else None
        min_length = spec.get("minLength") if isinstance(spec.get("minLength"), int) else None
        long_text = long_text or (max_length is not None and max_length > 200)
        return replace(
            base,
            kind="textarea" if long_text else "text",
            min_length=min_length,
            max_length=max_length,
        )
    return replace(base, label=f"{label} (JSON)")


def _json_field(name: str, label: str, *, required: bool) -> FormField:
    return FormField(name=name, label=label, kind="json", required=required)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _as_text(value: Any) -> str:
    """A default as the input shows it: strings and numbers as they are, the rest as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)


def _shown(item: FormField, value: Any) -> str:
    """``value`` as ``item``'s input shows it (a choice's is its JSON text)."""
    if value is None:
        return ""
    if item.kind in ("boolean", "choice"):
        return json.dumps(value)
    return _as_text(value)


def _read_field(item: FormField, text: str) -> tuple[Any, str | None]:
    """The JSON value of one submitted field, or the problem with it."""
    if text.strip() == "" and item.kind != "text" and item.kind != "textarea":
        return _empty(item)
    if item.kind in ("text", "textarea"):
        if text == "":
            return _empty(item)
        return _read_text(item, text)
    if item.kind in ("boolean", "choice"):
        allowed = {choice.value for choice in item.choices}
        if text not in allowed:
            return None, "Choose one of the options."
        return json.loads(text), None
    if item.kind in ("number", "integer"):
        return _read_number(item, text.strip())
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"This is not valid JSON ({exc})."


def _empty(item: FormField) -> tuple[Any, str | None]:
    if item.nullable:
        return None, None
    if item.required:
        return None, "Choose an answer." if item.kind in ("boolean", "choice") else "Required."
    return _OMITTED, None


def _read_text(item: FormField, text: str) -> tuple[Any, str | None]:
    if item.min_length is not None and len(text) < item.min_length:
        return None, f"Enter at least {item.min_length} characters."
    if item.max_length is not None and len(text) > item.max_length:
        return None, f"Enter at most {item.max_length} characters."
    return text, None


def _read_number(item: FormField, text: str) -> tuple[Any, str | None]:
    try:
        value: int | float = int(text) if item.kind == "integer" else float(text)
    except ValueError:
        return None, "Enter a whole number." if item.kind == "integer" else "Enter a number."
    if isinstance(value, float) and not math.isfinite(value):
        return None, "Enter a finite number."
    if item.minimum is not None and value < item.minimum:
        return None, f"Enter {_plain(item.minimum)} or more."
    if item.maximum is not None and value > item.maximum:
        return None, f"Enter {_plain(item.maximum)} or less."
    if isinstance(value, float) and value.is_integer() and "." not in text and "e" not in text:
        return int(value), None
    return value, None


def _plain(number: float) -> str:
    return str(int(number)) if number.is_integer() else str(number)
