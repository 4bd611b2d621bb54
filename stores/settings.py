"""The process's settings: every environment variable Turnstile reads, in one typed model.

:class:`Settings` is the only place the environment is read (``engine`` reads none; the
command line's own options are Click's, ``workers/cli/params.py``). Each field names its
variable; a value that does not parse raises :class:`InvalidSettingsError`, naming the
variable. What a setting configures is then handed down as arguments:
``Engine(model=..., **settings.engine_options())``, ``settings.build_model()``,
``configure_tracing(settings.tracing_config())``, ``create_app(..., ui_settings=...)``, and
the stores' defaults (:func:`stores.default_url`, ``SqlSessionStore()``).

It lives in ``stores`` rather than ``workers`` because the stores read their defaults from
it, and ``stores`` may not import ``workers`` (``docs/architecture.md``).

``turnstile worker`` and ``turnstile serve`` read the settings once, resolve ``--db`` (and
the pool size) into them, and install them (:func:`install_settings`) before they import
the app: :func:`current_settings` then returns those, so an app module that asks for them
gets the command's database. Outside a command, :func:`current_settings` reads the
environment when called.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.agent import DEFAULT_UNCLAIMED_WARNING
from engine.engine import EngineOptions
from engine.models.config import parse_model_spec

if TYPE_CHECKING:
    from engine.model import Model
    from engine.remote.ui.kit import UiSettings
    from engine.telemetry.tracing import TracingConfig

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_UI_POLL_SECONDS",
    "DEFAULT_UNCLAIMED_WARNING",
    "InvalidSettingsError",
    "Settings",
    "current_settings",
    "install_settings",
    "read_settings",
    "using_settings",
]

#: The database when none is configured: an SQLite file under ``.turnstile/``.
DEFAULT_DATABASE_URL = "sqlite:///.turnstile/turnstile.db"
#: ``pool_size`` of a store built without one.
DEFAULT_POOL_SIZE = 10
#: How often the inbox's pages look for changes, in seconds.
DEFAULT_UI_POLL_SECONDS = 3.0
#: The inbox's pages never poll more often than this, whatever the variable says.
MIN_UI_POLL_SECONDS = 0.5

#: What :func:`_seconds` returns for a blank value.
_UnsetT = TypeVar("_UnsetT", float, None)


class InvalidSettingsError(ValueError):
    """A variable holds a value its setting refuses; the message names each such variable."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        super().__init__(" ".join(problems.values()))
        #: The refused variables, each with what is wrong with it.
        self.problems = dict(problems)


def _variable(cls: type[BaseSettings], info: ValidationInfo) -> str:
    """The environment variable of the field being validated."""
    alias = cls.model_fields[str(info.field_name)].validation_alias
    return str(alias)


def _text(value: Any) -> str | None:
    """``value`` stripped; ``None`` when it is blank (a blank variable counts as unset)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _number(value: Any) -> float | None:
    """``value`` as a float (``None`` when it is not a number at all)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _seconds(
    value: Any, variable: str, unset: _UnsetT, accepts: Callable[[float], bool], must_be: str
) -> float | _UnsetT:
    """The number of seconds ``value`` holds (``unset`` when it is blank); one that is not a
    number, or that ``accepts`` refuses, raises ``ValueError``: "``variable`` must be
    ``must_be`` ``value``" (``must_be`` ends with the word that introduces the value)."""
    text = _text(value)
    if text is None:
        return unset
    seconds = _number(text)
    if seconds is None or not accepts(seconds):
        raise ValueError(f"{variable} must be {must_be} {text!r}.")
    return seconds


class Settings(BaseSettings):
    """Every setting Turnstile reads from the environment, typed and checked.

    ``Settings()`` reads the environment (exact variable names; a variable set to the empty
    string counts as unset). Prefer :func:`read_settings`, which reports bad values as
    :class:`InvalidSettingsError`. ``docs/configuration.md`` lists the same variables, and a
    test keeps the two in agreement.
    """

    model_config = SettingsConfigDict(
        case_sensitive=True,
        env_ignore_empty=True,
        frozen=True,
        extra="ignore",
        protected_namespaces=(),
    )

    # -- the database ------------------------------------------------------------------

    database_url: str = Field(
        DEFAULT_DATABASE_URL, validation_alias="TURNSTILE_DATABASE_URL", repr=False
    )
    """The database: ``postgresql://…``, ``postgres://…`` or ``sqlite:///path``."""

    db_pool_size: int = Field(DEFAULT_POOL_SIZE, validation_alias="TURNSTILE_DB_POOL_SIZE")
    """``pool_size`` of a ``SqlSessionStore`` built without one (a whole number >= 1)."""

    pg_planner: bool = Field(True, validation_alias="TURNSTILE_PG_PLANNER")
    """Whether the hot path's PostgreSQL connections get ``stores.pg.PLANNER_SETTINGS``
    (the variable's ``off`` turns it off; any other value leaves it on)."""

    pgconnect_timeout: str | None = Field(None, validation_alias="PGCONNECT_TIMEOUT")
    """libpq's own connect timeout; a starting command sets one per attempt when unset."""

    # -- the engine ----------------------------------------------------------------------

    state_keys: Annotated[dict[str, str] | None, NoDecode] = Field(
        None, validation_alias="TURNSTILE_STATE_KEYS", repr=False
    )
    """Keys signing client-managed state, from ``kid1:secret1,kid2:secret2`` (the first
    signs, all verify)."""

    state_max_age: float | None = Field(None, validation_alias="TURNSTILE_STATE_MAX_AGE")
    """Seconds after which a signed state blob is refused (``None``: no limit)."""

    app_version: str | None = Field(None, validation_alias="TURNSTILE_APP_VERSION")
    """The application version new turns are pinned to (``None``: each agent's tools
    version, and lenient pinning)."""

    unclaimed_warning: float = Field(
        DEFAULT_UNCLAIMED_WARNING, validation_alias="TURNSTILE_UNCLAIMED_WARNING"
    )
    """Seconds before a caller waiting for an unclaimed queued turn warns (0: never)."""

    # -- the inbox's web pages -----------------------------------------------------------

    ui_secret: str | None = Field(None, validation_alias="TURNSTILE_UI_SECRET", repr=False)
    """The secret signing the inbox pages' session cookies (``None``: one per process)."""

    ui_poll_seconds: float = Field(
        DEFAULT_UI_POLL_SECONDS, validation_alias="TURNSTILE_UI_POLL_SECONDS"
    )
    """How often the inbox's pages look for changes, in seconds (at least 0.5)."""

    # -- the model -----------------------------------------------------------------------

    model: str | None = Field(None, validation_alias="TURNSTILE_MODEL")
    """``provider:model`` (``openai:…``, ``anthropic:…``, ``ollama:…``); ``None``: the
    application's own default."""

    model_headers: Annotated[dict[str, str] | None, NoDecode] = Field(
        None, validation_alias="TURNSTILE_MODEL_HEADERS", repr=False
    )
    """Extra HTTP headers of every model request, from a JSON object."""

    model_timeout: float | None = Field(None, validation_alias="TURNSTILE_MODEL_TIMEOUT")
    """Model request timeout in seconds (``None``: the adapter's)."""

    openai_api_key: str | None = Field(None, validation_alias="OPENAI_API_KEY", repr=False)
    """The key of the OpenAI-compatible endpoint."""

    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")
    """The OpenAI-compatible endpoint (``None``: OpenAI's; Ollama's for ``ollama:``)."""

    anthropic_api_key: str | None = Field(None, validation_alias="ANTHROPIC_API_KEY", repr=False)
    """The key of the Anthropic endpoint."""

    anthropic_base_url: str | None = Field(None, validation_alias="ANTHROPIC_BASE_URL")
    """The Anthropic endpoint (``None``: Anthropic's)."""

    # -- traces: OpenTelemetry's own variables (the SDK reads the rest itself) --------------

    otel_traces_exporter: str | None = Field(None, validation_alias="OTEL_TRACES_EXPORTER")
    """Comma-separated span exporters, or ``none``."""

    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    """Where OTLP goes (``/v1/traces`` appended); set alone, it means ``otlp``."""

    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    """Where OTLP spans go, as is; set alone, it means ``otlp``."""

    otel_exporter_otlp_protocol: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    """What ``otlp`` means: ``http/protobuf`` or ``grpc``."""

    otel_exporter_otlp_traces_protocol: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    )
    """The same for spans; wins over the one above."""

    otel_sdk_disabled: bool = Field(False, validation_alias="OTEL_SDK_DISABLED")
    """``true``: no exporter, whatever the variables above say."""

    otel_service_name: str | None = Field(None, validation_alias="OTEL_SERVICE_NAME")
    """The service of every span (else ``turnstile``, unless the attributes name one)."""

    otel_resource_attributes: str | None = Field(None, validation_alias="OTEL_RESOURCE_ATTRIBUTES")
    """``key=value,…`` of every span's resource."""

    # -- the checks ----------------------------------------------------------------------

    @field_validator(
        "pgconnect_timeout",
        "app_version",
        "ui_secret",
        "openai_api_key",
        "openai_base_url",
        "anthropic_api_key",
        "anthropic_base_url",
        "otel_traces_exporter",
        "otel_exporter_otlp_endpoint",
        "otel_exporter_otlp_traces_endpoint",
        "otel_exporter_otlp_protocol",
        "otel_exporter_otlp_traces_protocol",
        "otel_service_name",
        "otel_resource_attributes",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: Any) -> str | None:
        return _text(value)

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any, info: ValidationInfo) -> str | None:
        spec = _text(value)
        if spec is not None:
            try:
                parse_model_spec(spec)
            except ValueError as exc:
                raise ValueError(f"{_variable(cls, info)}={spec!r}: {exc}") from None
        return spec

    @field_validator("database_url", mode="before")
    @classmethod
    def _database_url(cls, value: Any) -> str:
        return _text(value) or DEFAULT_DATABASE_URL

    @field_validator("db_pool_size", mode="before")
    @classmethod
    def _pool_size(cls, value: Any, info: ValidationInfo) -> int:
        text = _text(value)
        if text is None:
            return DEFAULT_POOL_SIZE
        try:
            size = int(text)
        except ValueError:
            size = 0
        if size < 1:
            raise ValueError(f"{_variable(cls, info)} must be a whole number >= 1, not {text!r}.")
        return size

    @field_validator("otel_sdk_disabled", mode="before")
    @classmethod
    def _otel_disabled(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        # OpenTelemetry's own reading: only "true", in any case, disables the SDK.
        return str(value).strip().lower() == "true"

    @field_validator("pg_planner", mode="before")
    @classmethod
    def _planner(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        return bool(value != "off")

    @field_validator("state_keys", mode="before")
    @classmethod
    def _state_keys(cls, value: Any, info: ValidationInfo) -> dict[str, str] | None:
        if value is None or isinstance(value, Mapping):
            return dict(value) if value else None
        keys: dict[str, str] = {}
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            kid, sep, secret = item.partition(":")
            if not sep or not kid or not secret:
                raise ValueError(
                    f"{_variable(cls, info)} must look like 'kid1:secret1,kid2:secret2'; got "
                    f"an entry {kid!r}."
                )
            keys[kid] = secret
        return keys or None

    @field_validator("state_max_age", "model_timeout", mode="before")
    @classmethod
    def _positive_seconds(cls, value: Any, info: ValidationInfo) -> float | None:
        return _seconds(
            value,
            _variable(cls, info),
            None,
            lambda seconds: seconds > 0 and not math.isinf(seconds),
            "a number of seconds > 0, not",
        )

    @field_validator("unclaimed_warning", mode="before")
    @classmethod
    def _unclaimed_warning(cls, value: Any, info: ValidationInfo) -> float:
        return _seconds(
            value,
            _variable(cls, info),
            DEFAULT_UNCLAIMED_WARNING,
            lambda seconds: seconds >= 0 and not math.isinf(seconds),
            "a number of seconds (0 turns the warning off); got",
        )

    @field_validator("ui_poll_seconds", mode="before")
    @classmethod
    def _ui_poll_seconds(cls, value: Any, info: ValidationInfo) -> float:
        seconds = _seconds(
            value,
            _variable(cls, info),
            DEFAULT_UI_POLL_SECONDS,
            lambda _: True,
            "a number of seconds, not",
        )
        # Faster polling would be a flood of requests, not a livelier page (nan: the floor too).
        return max(MIN_UI_POLL_SECONDS, seconds)

    @field_validator("model_headers", mode="before")
    @classmethod
    def _model_headers(cls, value: Any, info: ValidationInfo) -> dict[str, str] | None:
        if value is None or isinstance(value, Mapping):
            return {str(k): str(v) for k, v in value.items()} if value else None
        text = _text(value)
        if text is None:
            return None
        try:
            headers = json.loads(text)
        except ValueError:
            headers = None
        if not isinstance(headers, dict):
            raise ValueError(
                f"{_variable(cls, info)} must be a JSON object of header names and values."
            )
        return {str(k): str(v) for k, v in headers.items()}

    # -- what they configure ---------------------------------------------------------------

    def engine_options(self) -> EngineOptions:
        """The keyword arguments of :class:`engine.Engine` configured here: signing keys,
        their maximum age, the app version and the unclaimed-turn warning, as
        ``Engine(model=..., **settings.engine_options())`` takes them."""
        return EngineOptions(
            state_keys=dict(self.state_keys) if self.state_keys else None,
            state_max_age=self.state_max_age,
            version=self.app_version,
            unclaimed_warning=self.unclaimed_warning,
        )

    def ui_settings(self, **options: Any) -> UiSettings:
        """The inbox pages' :class:`~engine.remote.ui.UiSettings` with the secret and the
        polling interval configured here (``options``, its other fields, are passed on):
        ``create_app(engine, ui_settings=settings.ui_settings())``."""
        from engine.remote.ui.kit import UiSettings

        return UiSettings(secret=self.ui_secret, poll_seconds=self.ui_poll_seconds, **options)

    def build_model(self, **options: Any) -> Model | None:
        """The model ``TURNSTILE_MODEL`` names, with the headers, timeout and its provider's
        key and endpoint configured here (``options``, the adapter's keyword arguments, win);
        ``None`` when no model is named (the application keeps its own default).

        Raises :class:`InvalidSettingsError` naming ``TURNSTILE_MODEL`` for a missing key, or
        for a provider whose SDK is missing (naming the extra to install), so an application
        module that builds its model at import is refused in one line.
        """
        if self.model is None:
            return None
        from engine.models.config import model_from_spec

        provider, _ = parse_model_spec(self.model)
        configured: dict[str, Any] = {}
        if self.model_headers:
            configured["headers"] = dict(self.model_headers)
        if self.model_timeout is not None:
            configured["timeout"] = self.model_timeout
        if provider == "anthropic":
            key, url = self.anthropic_api_key, self.anthropic_base_url
        else:
            key, url = self.openai_api_key, self.openai_base_url
        if key is not None:
            configured["api_key"] = key
        if url is not None:
            configured["base_url"] = url
        try:
            return model_from_spec(self.model, **{**configured, **options})
        except (ValueError, ImportError) as exc:
            raise InvalidSettingsError(
                {"TURNSTILE_MODEL": f"TURNSTILE_MODEL={self.model!r}: {exc}"}
            ) from exc

    def tracing_config(self) -> TracingConfig:
        """The ``OTEL_*`` values :func:`engine.telemetry.tracing.configure_tracing` acts on."""
        from engine.telemetry.tracing import TracingConfig

        return TracingConfig(
            traces_exporter=self.otel_traces_exporter,
            otlp_endpoint=self.otel_exporter_otlp_endpoint,
            otlp_traces_endpoint=self.otel_exporter_otlp_traces_endpoint,
            otlp_protocol=self.otel_exporter_otlp_protocol,
            otlp_traces_protocol=self.otel_exporter_otlp_traces_protocol,
            sdk_disabled=self.otel_sdk_disabled,
            service_name=self.otel_service_name,
            resource_attributes=self.otel_resource_attributes,
        )

    # -- what the variables are ------------------------------------------------------------

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Every variable the model reads, each with its field's name."""
        return {str(info.validation_alias): name for name, info in cls.model_fields.items()}


def read_settings() -> Settings:
    """The settings the environment holds now; raises :class:`InvalidSettingsError`
    naming each variable whose value does not parse."""
    try:
        return Settings()
    except ValidationError as exc:
        problems: dict[str, str] = {}
        for error in exc.errors():
            variable = ".".join(str(part) for part in error["loc"])
            cause = (error.get("ctx") or {}).get("error")
            problems[variable] = str(cause) if cause else f"{variable}: {error['msg']}."
        raise InvalidSettingsError(problems) from None


#: The settings a command installed (``None``: read the environment when asked).
_installed: Settings | None = None


def current_settings() -> Settings:
    """The process's settings: those a command installed with :func:`using_settings`
    (``turnstile worker`` and ``serve`` do, with ``--db`` resolved, before importing the
    app), else the environment's, read now (:func:`read_settings`)."""
    return _installed if _installed is not None else read_settings()


def install_settings(settings: Settings | None) -> Settings | None:
    """Make ``settings`` what :func:`current_settings` returns from now on (``None``: read
    the environment again); returns the ones installed before. A command installs its
    settings before importing the app; :func:`using_settings` undoes it at the end."""
    global _installed
    previous, _installed = _installed, settings
    return previous


@contextmanager
def using_settings(settings: Settings | None) -> Iterator[Settings | None]:
    """Install ``settings`` (``None``: none) until the block ends, then put back the ones
    installed before, whatever was installed meanwhile."""
    previous = install_settings(settings)
    try:
        yield settings
    finally:
        install_settings(previous)
