"""Input/output schemas of tools and interrupts.

A schema is a pydantic model class (the usual case: values are validated into instances), a
JSON-schema dict (values stay plain JSON, validated with ``jsonschema``), or ``None`` (any
JSON value is accepted).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

__all__ = ["Schema", "SchemaSpec", "SchemaViolation", "canonical_json", "to_jsonable"]

SchemaSpec = type[BaseModel] | dict[str, Any] | None


class SchemaViolation(ValueError):
    """A value does not match its schema; the message says where and why."""


def _violation(exc: ValidationError) -> SchemaViolation:
    """Pydantic's errors as one :class:`SchemaViolation`: ``where: why`` per problem."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
    )
    return SchemaViolation(problems)


def to_jsonable(value: Any) -> Any:
    """Turn pydantic instances (anywhere inside ``value``) into plain JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys and no whitespace: equal values, equal text (what
    equality of answers and arguments compares, and what an edited call's key hashes)."""
    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"))


class Schema:
    """Validates values against a pydantic model, a JSON-schema dict, or nothing."""

    def __init__(self, spec: SchemaSpec) -> None:
        if spec is not None and not (
            isinstance(spec, dict) or (isinstance(spec, type) and issubclass(spec, BaseModel))
        ):
            raise TypeError(
                "A schema must be a pydantic model class, a JSON-schema dict or None; "
                f"got {spec!r}."
            )
        if isinstance(spec, dict):
            jsonschema.Draft202012Validator.check_schema(spec)
        self.spec = spec

    @property
    def model(self) -> type[BaseModel] | None:
        """The pydantic model class, when the schema is one."""
        return self.spec if isinstance(self.spec, type) else None

    def json_schema(self) -> dict[str, Any] | None:
        """The JSON schema offered to models (``None`` when unconstrained)."""
        if self.spec is None:
            return None
        if isinstance(self.spec, dict):
            return self.spec
        return self.spec.model_json_schema()

    def parse(self, value: Any) -> Any:
        """Validate JSON data (or an instance) and return the typed value.

        Pydantic schemas return a model instance; dict schemas and ``None`` return the JSON.
        """
        if self.spec is None:
            return to_jsonable(value)
        if isinstance(self.spec, dict):
            data = to_jsonable(value)
            errors = sorted(jsonschema.Draft202012Validator(self.spec).iter_errors(data), key=str)
            if errors:
                first = errors[0]
                where = "/".join(str(p) for p in first.absolute_path) or "(root)"
                raise SchemaViolation(f"at {where}: {first.message}")
            return data
        if isinstance(value, self.spec):
            return value
        try:
            return self.spec.model_validate(to_jsonable(value))
        except ValidationError as exc:
            raise _violation(exc) from exc

    def check_json(self, value: Any) -> None:
        """Validate JSON data *as the JSON it is*: strictly, with no coercion.

        :meth:`parse` validates pydantic schemas in lax mode, turning ``"yes"`` or ``1`` into
        ``True``. An interrupt's answer is stored and shown to the model verbatim, so a value
        that only passes by coercion would reach the model as what the schema forbids: answers
        are checked here instead.
        """
        self.parse(value)
        spec = self.spec
        if isinstance(spec, type) and issubclass(spec, BaseModel):
            try:
                spec.model_validate_json(json.dumps(to_jsonable(value)), strict=True)
            except ValidationError as exc:
                raise _violation(exc) from exc

    def dump(self, value: Any) -> Any:
        """Validate and return plain JSON data (what is stored and sent on the wire)."""
        return to_jsonable(self.parse(value))
