"""The settings model: every variable Turnstile reads, parsed once, refused by name."""

from __future__ import annotations

import pytest

from stores.settings import (
    DEFAULT_DATABASE_URL,
    InvalidSettingsError,
    Settings,
    current_settings,
    read_settings,
    using_settings,
)


@pytest.fixture(autouse=True)
def no_settings_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment that sets none of the model's variables."""
    for variable in Settings.variables():
        monkeypatch.delenv(variable, raising=False)


def test_unset_variables_give_the_defaults() -> None:
    """With nothing set, every setting has its default."""
    settings = read_settings()
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.db_pool_size == 10
    assert settings.pg_planner is True
    assert settings.state_keys is None
    assert settings.app_version is None
    assert settings.unclaimed_warning == 30.0
    assert settings.ui_poll_seconds == 3.0
    assert settings.model is None


def test_values_are_parsed_and_blank_ones_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys, headers and numbers are parsed; blanks and the empty string are unset."""
    monkeypatch.setenv("TURNSTILE_STATE_KEYS", " new:secret-new ,, old:secret:with:colons ")
    monkeypatch.setenv("TURNSTILE_MODEL_HEADERS", '{"X-Team": "payments", "X-Retry": 2}')
    monkeypatch.setenv("TURNSTILE_DB_POOL_SIZE", " 3 ")
    monkeypatch.setenv("TURNSTILE_UI_POLL_SECONDS", "0.1")
    monkeypatch.setenv("TURNSTILE_PG_PLANNER", "off")
    monkeypatch.setenv("TURNSTILE_APP_VERSION", "   ")
    monkeypatch.setenv("TURNSTILE_DATABASE_URL", "")
    monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", "0")
    settings = read_settings()
    assert settings.state_keys == {"new": "secret-new", "old": "secret:with:colons"}
    assert settings.model_headers == {"X-Team": "payments", "X-Retry": "2"}
    assert settings.db_pool_size == 3
    assert settings.ui_poll_seconds == 0.5  # never faster than half a second
    assert settings.pg_planner is False
    assert settings.app_version is None
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.unclaimed_warning == 0.0


def test_variable_names_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable spelt in another case is not the setting's."""
    monkeypatch.setenv("turnstile_model", "openai:gpt-4o-mini")
    assert read_settings().model is None


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TURNSTILE_DB_POOL_SIZE", "many", "TURNSTILE_DB_POOL_SIZE must be a whole number >= 1"),
        ("TURNSTILE_DB_POOL_SIZE", "0", "TURNSTILE_DB_POOL_SIZE must be a whole number >= 1"),
        ("TURNSTILE_STATE_KEYS", "nokey", "TURNSTILE_STATE_KEYS must look like 'kid1:secret1"),
        ("TURNSTILE_STATE_MAX_AGE", "soon", "TURNSTILE_STATE_MAX_AGE must be a number"),
        ("TURNSTILE_UNCLAIMED_WARNING", "-1", "TURNSTILE_UNCLAIMED_WARNING must be a number"),
        ("TURNSTILE_UNCLAIMED_WARNING", "inf", "TURNSTILE_UNCLAIMED_WARNING must be a number"),
        ("TURNSTILE_UI_POLL_SECONDS", "often", "TURNSTILE_UI_POLL_SECONDS must be a number"),
        ("TURNSTILE_MODEL_HEADERS", "[1]", "TURNSTILE_MODEL_HEADERS must be a JSON object"),
        ("TURNSTILE_MODEL_HEADERS", "{", "TURNSTILE_MODEL_HEADERS must be a JSON object"),
        ("TURNSTILE_MODEL_TIMEOUT", "0", "TURNSTILE_MODEL_TIMEOUT must be a number of seconds"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """A value that does not parse raises InvalidSettingsError (a ValueError) naming it."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidSettingsError, match=message) as refused:
        read_settings()
    assert isinstance(refused.value, ValueError)
    assert list(refused.value.problems) == [variable]


def test_every_bad_value_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two refused variables are both named in one error."""
    monkeypatch.setenv("TURNSTILE_DB_POOL_SIZE", "-2")
    monkeypatch.setenv("TURNSTILE_STATE_MAX_AGE", "-5")
    with pytest.raises(InvalidSettingsError) as refused:
        read_settings()
    assert set(refused.value.problems) == {"TURNSTILE_DB_POOL_SIZE", "TURNSTILE_STATE_MAX_AGE"}


def test_secrets_stay_out_of_the_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys, secrets, headers and the database URL (its password) are not in repr()."""
    secrets = {
        "TURNSTILE_STATE_KEYS": "kid:state-secret",
        "TURNSTILE_UI_SECRET": "ui-secret-" + "x" * 32,
        "OPENAI_API_KEY": "sk-openai-secret",
        "ANTHROPIC_API_KEY": "sk-ant-secret",
        "TURNSTILE_MODEL_HEADERS": '{"Authorization": "Bearer header-secret"}',
        "TURNSTILE_DATABASE_URL": "postgresql://u:db-secret@h/db",
    }
    for variable, value in secrets.items():
        monkeypatch.setenv(variable, value)
    shown = repr(read_settings())
    for secret in ("state-secret", "ui-secret", "openai-secret", "ant-secret", "header-secret"):
        assert secret not in shown
    assert "db-secret" not in shown


def test_installed_settings_are_current_until_the_block_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside using_settings, current_settings() returns the installed object, whatever the
    environment says; outside, it reads the environment when called."""
    monkeypatch.setenv("TURNSTILE_APP_VERSION", "from-env")
    installed = read_settings().model_copy(update={"app_version": "installed"})
    with using_settings(installed):
        monkeypatch.setenv("TURNSTILE_APP_VERSION", "changed")
        assert current_settings() is installed
    assert current_settings().app_version == "changed"


def test_the_model_lists_its_variables() -> None:
    """Each field names one variable, and no two fields share one."""
    variables = Settings.variables()
    assert len(variables) == len(Settings.model_fields)
    assert variables["TURNSTILE_DATABASE_URL"] == "database_url"
    assert variables["OPENAI_API_KEY"] == "openai_api_key"


def test_defaults_agree_with_the_engines_own() -> None:
    """Where the engine has a default of its own for a setting, the model's is the same."""
    from engine.agent import DEFAULT_UNCLAIMED_WARNING
    from engine.remote.ui.kit import DEFAULT_POLL_SECONDS
    from stores.database import DEFAULT_SQLITE_PATH

    fields = Settings.model_fields
    assert fields["unclaimed_warning"].default == DEFAULT_UNCLAIMED_WARNING
    assert fields["ui_poll_seconds"].default == DEFAULT_POLL_SECONDS
    assert fields["database_url"].default == f"sqlite:///{DEFAULT_SQLITE_PATH}"
