"""Published signing keys: ``check_deployable_keys`` refuses them (and missing keys) for
client-managed agents unless ``dev``, and knows every key written in examples/ and docs/.

The forged-approval test shows why: with the example's key, anyone can sign a paused state
whose approval nobody gave, and the agent runs the transfer.
"""

from __future__ import annotations

import ast
import logging
import re
import secrets
from pathlib import Path

import pytest

from engine import Engine, ScriptedModel
from engine.errors import InsecureKeyError, TurnstileError
from engine.state.signing import (
    MIN_SECRET_BYTES,
    PUBLISHED_KEY_FINGERPRINTS,
    StateSigner,
    check_deployable_keys,
    key_fingerprint,
)
from examples import banking, tour
from examples.banking import build
from stores import InMemorySessionStore
from stores.settings import read_settings
from tests.acceptance import durable_app
from tests.conftest import TEST_STATE_KEYS

ROOT = Path(__file__).resolve().parents[2]
#: A key nobody has seen: made for this run, so it is written nowhere.
FRESH = {"prod-2025": secrets.token_urlsafe(32)}
STATELESS = "bankingAgentStateless"


def _example_key() -> dict[str, str | bytes]:
    return dict(banking._example_keys())


def test_the_examples_key_is_refused_naming_the_agent_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The banking example's fixed key: refused, the message names the agent, the key id and
    how to configure a key, and shows no key material."""
    monkeypatch.delenv("TURNSTILE_STATE_KEYS", raising=False)
    app = build(state_keys=_example_key())
    with pytest.raises(InsecureKeyError) as refused:
        check_deployable_keys(app.ai, dev=False)
    message = str(refused.value)
    assert f"Agent '{STATELESS}'" in message
    assert "'example-only'" in message
    assert "TURNSTILE_STATE_KEYS=<key id>:<secret>" in message
    assert "--dev" in message
    assert "turnstile-example-key-not-a-secret" not in message
    assert isinstance(refused.value, TurnstileError)


def test_a_missing_key_is_refused() -> None:
    """No configured key: the signer makes a random one, fit for one process only."""
    ai = Engine(model=ScriptedModel(), state_keys={})
    ai.define_agent(name="clientSide", store=None)
    assert ai.signer.generated
    with pytest.raises(InsecureKeyError, match=r"Agent 'clientSide'.*no configured key"):
        check_deployable_keys(ai, dev=False)


def test_dev_logs_a_warning_and_returns_the_key_ids(caplog: pytest.LogCaptureFixture) -> None:
    """``dev``: the same finding is a WARNING, and the active key ids come back."""
    app = build(state_keys=_example_key())
    with caplog.at_level(logging.WARNING, logger="turnstile.signing"):
        assert check_deployable_keys(app.ai, dev=True) == ["example-only"]
    [record] = [r for r in caplog.records if r.name == "turnstile.signing"]
    assert record.levelno == logging.WARNING
    assert STATELESS in record.getMessage() and "--dev" in record.getMessage()
    assert "turnstile-example-key-not-a-secret" not in record.getMessage()


def test_a_configured_key_passes_and_ids_come_signing_key_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fresh keys: no refusal, no warning; the ids (never secrets) with the signing one first."""
    keys = {"new": secrets.token_urlsafe(32), "old": secrets.token_urlsafe(32)}
    app = build(state_keys=keys)
    with caplog.at_level(logging.WARNING):
        assert check_deployable_keys(app.ai, dev=False) == ["new", "old"]
    assert not [r for r in caplog.records if r.name == "turnstile.signing"]


def test_a_published_key_kept_only_to_verify_is_refused_too() -> None:
    """Rotation does not help: a published key that still verifies lets anyone forge."""
    app = build(state_keys={**FRESH, **_example_key()})
    with pytest.raises(InsecureKeyError, match="'example-only'"):
        check_deployable_keys(app.ai, dev=False)


def test_an_app_without_client_managed_agents_needs_no_key() -> None:
    """Keys only matter to agents without a store: none, nothing to check, no ids."""
    ai = Engine(model=ScriptedModel(), state_keys={})
    ai.define_agent(name="stored", store=InMemorySessionStore())
    assert check_deployable_keys(ai, dev=False) == []


def test_every_client_managed_agent_is_named() -> None:
    """Two client-managed agents: both named in one refusal."""
    ai = Engine(model=ScriptedModel(), state_keys=_example_key())
    ai.define_agent(name="first", store=None)
    ai.define_agent(name="second", store=None)
    with pytest.raises(InsecureKeyError) as refused:
        check_deployable_keys(ai, dev=False)
    assert "Agent 'first'" in str(refused.value) and "Agent 'second'" in str(refused.value)


def test_the_environments_keys_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A published key pasted into TURNSTILE_STATE_KEYS is refused like one in code."""
    monkeypatch.setenv("TURNSTILE_STATE_KEYS", "kid1:secret1,kid2:secret2")
    ai = Engine(model=ScriptedModel(), **read_settings().engine_options())
    ai.define_agent(name="clientSide", store=None)
    with pytest.raises(InsecureKeyError, match="'kid1', 'kid2'"):
        check_deployable_keys(ai, dev=False)


async def test_the_example_key_forges_an_approval() -> None:
    """Why the check exists: whoever has the example's key signs a paused state in which the
    approval was given, and the agent runs the transfer no human approved."""
    app = build(state_keys=_example_key())
    agent = app.banking_agent_stateless
    paused = await agent.chat().send("Transfer $1000000 to my savings account.")
    assert paused.interrupts and paused.state is not None
    approval = paused.interrupts[0]
    # The attacker resumes with the forged "yes" through a signer built from the public key.
    forger = StateSigner(_example_key())
    forged = forger.sign(paused.state, agent=agent.name)
    done = await agent.chat(state=forged).resume(respond=[approval.respond({"approved": True})])
    assert "Transaction" in str(done.text)
    assert [request.amount for _key, request in app.transfers] == [1000000]


# -- every key written in examples/ and docs/ is known ------------------------------------

#: A whole ``kid:secret,kid:secret`` value as the configuration examples write it (a
#: trailing ``,…`` allowed); a value computed by a shell (``$(openssl …)``) is no key.
_SPEC = re.compile(r"[A-Za-z0-9_-]{1,64}:[^\s,`\"'$…]+(,[A-Za-z0-9_-]{1,64}:[^\s,`\"'$…]+)*(,…)?")


def _doc_secrets() -> set[str]:
    """Secrets of the ``TURNSTILE_STATE_KEYS`` values quoted in the docs and the README."""
    found: set[str] = set()
    texts = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    texts += [ROOT / extra for extra in ("compose.yaml", "Dockerfile") if (ROOT / extra).exists()]
    for path in texts:
        for line in path.read_text().splitlines():
            if "STATE_KEYS" not in line:
                continue
            for quoted in re.findall(r"`([^`]*)`", line) + re.findall(r'"([^"]*)"', line):
                if _SPEC.fullmatch(quoted):
                    for pair in quoted.split(","):
                        if pair != "…":
                            found.add(pair.partition(":")[2])
    return found


def _dict_literals(tree: ast.AST) -> list[dict[str, str]]:
    """str → str dict literals assigned to a ``*KEYS`` name, passed as ``state_keys=`` or
    returned by a function named ``*keys*``."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id.upper().endswith("KEYS") for t in node.targets)
        ) or (isinstance(node, ast.keyword) and node.arg == "state_keys"):
            found.append(node.value)
        elif isinstance(node, ast.FunctionDef) and "keys" in node.name.lower():
            found.extend(r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value)
    literals: list[dict[str, str]] = []
    for value in found:
        if isinstance(value, ast.Dict):
            pairs = zip(value.keys, value.values, strict=True)
            literal = {
                k.value: v.value
                for k, v in pairs
                if isinstance(k, ast.Constant)
                and isinstance(v, ast.Constant)
                and isinstance(k.value, str)
                and isinstance(v.value, str)
            }
            if literal:
                literals.append(literal)
    return literals


def _example_secrets() -> set[str]:
    """Secrets written as dict literals in examples/*.py."""
    found: set[str] = set()
    for path in sorted((ROOT / "examples").glob("*.py")):
        for literal in _dict_literals(ast.parse(path.read_text())):
            found.update(literal.values())
    return found


def _spec_secrets(spec: str) -> set[str]:
    """The secrets of a ``kid:secret,kid:secret`` value (none if it is not one)."""
    if not _SPEC.fullmatch(spec):
        return set()
    return {pair.partition(":")[2] for pair in spec.split(",") if pair != "…"}


def _env_specs(tree: ast.AST) -> list[str]:
    """String values given to ``TURNSTILE_STATE_KEYS``: in a dict literal, as a keyword
    (``dict(TURNSTILE_STATE_KEYS=...)``) or as the second argument of a call (``setenv``)."""
    name = "TURNSTILE_STATE_KEYS"
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found.extend(
                value
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant) and key.value == name
            )
        elif isinstance(node, ast.keyword) and node.arg == name:
            found.append(node.value)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            first = node.args[0]
            if isinstance(first, ast.Constant) and first.value == name:
                found.append(node.args[1])
    return [
        value.value
        for value in found
        if isinstance(value, ast.Constant) and isinstance(value.value, str)
    ]


def _suite_secrets() -> set[str]:
    """Secrets written in tests/: dict literals as in the examples, and the values the tests
    give ``TURNSTILE_STATE_KEYS``."""
    found: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for literal in _dict_literals(tree):
            found.update(literal.values())
        for spec in _env_specs(tree):
            found.update(_spec_secrets(spec))
    return found


def test_the_scans_find_the_known_examples() -> None:
    """The scanners below are not vacuous: they find the keys known to be written down."""
    assert set(_example_key().values()) <= _example_secrets()
    assert set(tour.DEMO_STATE_KEYS.values()) <= _example_secrets()
    assert {"secret1", "secret2"} <= _doc_secrets()
    suite = _suite_secrets()
    assert set(TEST_STATE_KEYS.values()) <= suite
    assert set(durable_app.STATE_KEYS.values()) <= suite
    assert "kid:state-secret".partition(":")[2] in suite  # tests/unit/test_settings.py


def test_every_key_in_the_examples_and_docs_is_a_published_key() -> None:
    """A key added to an example or a doc must join PUBLISHED_KEY_FINGERPRINTS."""
    unknown = sorted(
        secret
        for secret in _example_secrets() | _doc_secrets()
        if key_fingerprint(secret) not in PUBLISHED_KEY_FINGERPRINTS
    )
    assert unknown == []


def test_no_key_written_in_the_suite_can_sign_in_production() -> None:
    """The suite's keys are public too: each is published or shorter than the minimum, so
    serve and worker refuse it without --dev (the processes the suite starts use a key made
    for the run: tests.http_support.DEPLOYABLE_STATE_KEYS)."""
    deployable = sorted(
        secret
        for secret in _suite_secrets()
        if len(secret.encode()) >= MIN_SECRET_BYTES
        and key_fingerprint(secret) not in PUBLISHED_KEY_FINGERPRINTS
    )
    assert deployable == []


def test_fingerprints_not_keys_are_stored() -> None:
    """signing.py holds the published keys only as fingerprints."""
    source = (ROOT / "engine" / "state" / "signing.py").read_text()
    for secret in _example_secrets() | _doc_secrets():
        assert f'"{secret}"' not in source
