"""Signed client-managed state (agents without a store).

Without a store the whole session — history, paused tool requests, the outputs of sibling
tools kept for replay — travels with the client. Genkit trusts whatever comes back; we sign
it, so a client cannot forge an approval, rewrite a pending output or graft one session's
history onto another.

The blob keeps Genkit's ``SessionState`` shape (``sessionId``, ``messages``, ``custom``,
``artifacts``) because the genuine JS client reads ``state.messages`` and echoes the object
back verbatim; we add one field, ``signature``::

    ts1.<key id>.<issued-at, unix seconds>.<base64url HMAC-SHA256>

The MAC covers a domain tag, the agent name, the issue time and the canonical JSON of every
other field (sorted keys, no spaces, integral floats written as integers so that a
JavaScript round trip of ``500.0`` → ``500`` does not break the signature). Keys are named,
so they can be rotated: the first key signs, every listed key verifies.

A key written in a public place (this repository's examples and docs) lets anyone forge a
paused state — an approval nobody gave. :func:`check_deployable_keys` is what ``turnstile
serve`` and ``turnstile worker`` call at startup to refuse such keys, and missing ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any, Protocol

from engine.errors import InsecureKeyError, InvalidStateError

__all__ = [
    "MIN_SECRET_BYTES",
    "PUBLISHED_KEY_FINGERPRINTS",
    "SIGNATURE_FIELD",
    "SignedAgents",
    "StateSigner",
    "canonical_json",
    "check_deployable_keys",
    "key_fingerprint",
]

logger = logging.getLogger("turnstile.signing")

SIGNATURE_FIELD = "signature"
_VERSION = "ts1"
_DOMAIN = b"turnstile-client-state-v1"
#: Where a deployment's keys usually come from (named in messages; read by ``stores.settings``).
_ENV_KEYS = "TURNSTILE_STATE_KEYS"
# JavaScript prints every integral double below 1e21 without a fraction (2.0**60 → digits).
_JS_INTEGRAL_LIMIT = 1e21
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Strict ASCII grammar: no Unicode digits, no leading zeros, an unpadded 32-byte base64url MAC,
# so that no two spellings of one signature exist.
_SIGNATURE = re.compile(r"ts1\.([A-Za-z0-9_-]{1,64})\.(0|[1-9][0-9]{0,15})\.([A-Za-z0-9_-]{43})")

#: SHA-256 (hex) of every signing secret written in this repository's examples, docs and
#: tests: the example apps' fixed keys, the placeholder secrets of the configuration
#: examples and the test suite's keys. Only fingerprints are kept, so the secrets themselves
#: are written in one place each; ``tests/unit/test_published_keys.py`` checks that every
#: key in examples/ and docs/ is here, and every one in tests/ here or too short to serve.
PUBLISHED_KEY_FINGERPRINTS: frozenset[str] = frozenset(
    {
        # examples/banking.py (the example's key when TURNSTILE_STATE_KEYS is unset)
        "554a4beed57f397b99e48bfde96471749e6021fb39e6cbddd1f5510804ae795b",
        # examples/tour.py
        "75a3c845d91518deab0730512ad0b5c4be785aed9b8b7b911ed6d7a4d0468a44",
        # docs/configuration.md: kid1:secret1,kid2:secret2
        "5b11618c2e44027877d0cd0921ed166b9f176f50587fc91e7534dd2946db77d6",
        "35224d0d3465d74e855f8d69a136e79c744ea35a675d3393360a327cbf6359a2",
        # docs/decisions.md: kid:secret
        "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b",
        # tests/: the suite's fixed keys of 32 bytes or more (shorter ones are refused anyway)
        "6585e3f19811ecac1314a14262459a87156bd7b801a30356f494f5837380f13e",
        "a542176c9195b3e2cbf4113ef3ff15cf8eaaa39d145128759cafcdd42e2915c5",
        "85766095b61de6d94116f51ef3aec4b4ce73ba0e8d17603cd8e15387ad1a5b0c",
        "bc237f7dc07968a927ffe763899cfb4a41ec777a3ba0a7ee09c79b8090e011c1",
    }
)

#: The shortest secret a deployment may sign with: the size of an HMAC-SHA256 output, so
#: that guessing the secret is never easier than forging a MAC.
MIN_SECRET_BYTES = 32

_HOW_TO_CONFIGURE = (
    f"Configure a secret key: {_ENV_KEYS}=<key id>:<secret> (a secret such as the output of "
    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`), which the app passes "
    "on as Engine(**current_settings().engine_options()) does, or "
    "Engine(state_keys={<key id>: <secret>}); --dev accepts it for local development only."
)


def _normalise(value: Any) -> Any:
    """Make ``value`` serialise the same way after a JSON round trip through JavaScript."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidStateError("State contains a non-finite number.")
        if value.is_integer() and abs(value) < _JS_INTEGRAL_LIMIT:
            return int(value)
        return value
    if isinstance(value, Mapping):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    raise InvalidStateError(f"State contains a value that is not JSON: {type(value).__name__}.")


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes of ``value`` (sorted keys, compact, integral floats as ints)."""
    return json.dumps(
        _normalise(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode()


def key_fingerprint(secret: str | bytes) -> str:
    """The SHA-256 (hex) of a signing secret, as :data:`PUBLISHED_KEY_FINGERPRINTS` holds."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(raw).hexdigest()


class StateSigner:
    """Signs and verifies client-managed state blobs.

    ``keys`` maps key ids to secrets; the first one signs, all of them verify (rotation: put
    the new key first, keep the old one until the blobs it signed have aged out). Without
    keys a random per-process key is made, and a warning logged when it first signs (blobs
    then only verify in this process). ``max_age`` (seconds; ``None``: unlimited) rejects
    blobs older than that. Neither is read from the environment: ``TURNSTILE_STATE_KEYS`` and
    ``TURNSTILE_STATE_MAX_AGE`` reach it through ``Engine(state_keys=, state_max_age=)``.
    """

    def __init__(
        self, keys: Mapping[str, str | bytes] | None = None, *, max_age: float | None = None
    ) -> None:
        parsed = {kid: s.encode() if isinstance(s, str) else s for kid, s in (keys or {}).items()}
        #: Whether no key was configured and a random one was made for this process.
        self.generated = not parsed
        if not parsed:
            parsed = {"ephemeral-" + secrets.token_hex(4): secrets.token_bytes(32)}
        # Said when the key is first used, not here: an app with no client-managed agent
        # never signs, and its every command would otherwise warn of a key it does not need.
        self._warned = not self.generated
        for kid in parsed:
            if not _KEY_ID.fullmatch(kid):
                raise ValueError(
                    f"State key id {kid!r} must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'."
                )
        self._keys = parsed
        self._active = next(iter(parsed))
        self.max_age = max_age

    @property
    def active_key_id(self) -> str:
        """The id of the key new blobs are signed with."""
        return self._active

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id: the signing key first, then those kept only to verify."""
        return tuple(self._keys)

    def published_key_ids(self) -> list[str]:
        """The ids of keys whose secret is one of :data:`PUBLISHED_KEY_FINGERPRINTS`."""
        return [
            kid
            for kid, secret in self._keys.items()
            if key_fingerprint(secret) in PUBLISHED_KEY_FINGERPRINTS
        ]

    def short_key_ids(self) -> list[str]:
        """The ids of keys whose secret is shorter than :data:`MIN_SECRET_BYTES`."""
        return [kid for kid, secret in self._keys.items() if len(secret) < MIN_SECRET_BYTES]

    def _mac(self, secret: bytes, agent: str, issued_at: int, body: Mapping[str, Any]) -> str:
        message = b"\n".join(
            [_DOMAIN, agent.encode(), str(issued_at).encode(), canonical_json(body)]
        )
        digest = hmac.new(secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def sign(
        self, state: Mapping[str, Any], *, agent: str, now: float | None = None
    ) -> dict[str, Any]:
        """Return ``state`` plus its ``signature`` field, bound to ``agent``."""
        self._warn_once()
        body = {k: v for k, v in state.items() if k != SIGNATURE_FIELD}
        body = _normalise(body)
        issued_at = int(time.time() if now is None else now)
        mac = self._mac(self._keys[self._active], agent, issued_at, body)
        return {**body, SIGNATURE_FIELD: f"{_VERSION}.{self._active}.{issued_at}.{mac}"}

    def _warn_once(self) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "No state signing key configured (Engine got no state_keys, e.g. from %s); "
                "using a random key %s, so client-managed state only verifies in this process.",
                _ENV_KEYS,
                self._active,
            )

    def verify(self, blob: Any, *, agent: str, now: float | None = None) -> dict[str, Any]:
        """Check ``blob`` and return the state without its signature.

        Raises :class:`~engine.errors.InvalidStateError` naming what is wrong: not an object,
        no or malformed signature, unknown key, bad MAC (tampered, truncated, or signed for
        another agent), expired, or no session id.
        """
        if not isinstance(blob, Mapping):
            raise InvalidStateError("Client state must be a JSON object.")
        signature = blob.get(SIGNATURE_FIELD)
        if not isinstance(signature, str):
            raise InvalidStateError(
                "Client state is not signed: send back the 'state' object exactly as the "
                "server returned it."
            )
        match = _SIGNATURE.fullmatch(signature)
        if match is None:
            raise InvalidStateError("Client state signature is malformed.")
        kid, issued_text, mac = match.groups()
        secret = self._keys.get(kid)
        if secret is None:
            raise InvalidStateError(
                f"Client state was signed with an unknown key {kid!r} (foreign or retired)."
            )
        issued_at = int(issued_text)
        body = {k: v for k, v in blob.items() if k != SIGNATURE_FIELD}
        expected = self._mac(secret, agent, issued_at, body)
        if not hmac.compare_digest(expected, mac):
            raise InvalidStateError(
                f"Client state signature does not match: the state was modified or was not "
                f"issued by agent '{agent}'."
            )
        current = time.time() if now is None else now
        if self.max_age is not None and current - issued_at > self.max_age:
            raise InvalidStateError(
                f"Client state expired: it is older than {self.max_age:g} seconds."
            )
        session_id = body.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidStateError("Client state has no sessionId.")
        result: dict[str, Any] = _normalise(body)
        return result


class _SigningAgent(Protocol):
    """What the key check reads of an agent."""

    @property
    def name(self) -> str: ...

    @property
    def store(self) -> object | None: ...

    @property
    def signer(self) -> StateSigner: ...


class SignedAgents(Protocol):
    """An app whose agents' keys can be checked: an :class:`~engine.Engine` (declared here
    so that this module needs no import of the engine, which imports it)."""

    @property
    def agents(self) -> Mapping[str, _SigningAgent]: ...


def _key_problem(signer: StateSigner) -> str | None:
    """Why ``signer``'s keys are unfit to serve with, or ``None`` when they are fit."""
    if signer.generated:
        return (
            "with no configured key (Engine got no state_keys): a random key made at startup "
            "would not verify its state after a restart or in another process"
        )
    # Each check: what finds the unfit keys' ids, and why they are unfit ({which}: those ids).
    checks = (
        (
            signer.published_key_ids,
            "with a key published in Turnstile's examples, docs or tests ({which}): anyone "
            "can sign a state it accepts, such as a paused transfer with a forged approval",
        ),
        (
            signer.short_key_ids,
            f"with a key shorter than {MIN_SECRET_BYTES} bytes "
            "({which}): a short secret can be guessed, and whoever guesses it signs any state",
        ),
    )
    for unfit_key_ids, problem in checks:
        unfit = unfit_key_ids()
        if unfit:
            return problem.format(which=", ".join(repr(kid) for kid in unfit))
    return None


def check_deployable_keys(app: SignedAgents, *, dev: bool) -> list[str]:
    """Refuse to serve client-managed agents whose state anyone could forge.

    For every agent of ``app`` (an :class:`~engine.Engine`) without a store (its state
    travels signed with the client), the signing keys must be configured, none may be a
    key published in this repository's examples, docs or tests, and none may be shorter
    than :data:`MIN_SECRET_BYTES`. Otherwise raises
    :class:`~engine.errors.InsecureKeyError` naming each such agent and how to configure a
    key — unless ``dev`` is true, when a warning is logged instead. Returns the key ids in
    use (signing key first, then the keys kept only to verify), never key material; empty
    when no agent is client-managed.
    """
    problems: list[str] = []
    key_ids: list[str] = []
    for agent in app.agents.values():
        if agent.store is not None:
            continue
        for kid in agent.signer.key_ids:
            if kid not in key_ids:
                key_ids.append(kid)
        problem = _key_problem(agent.signer)
        if problem is not None:
            problems.append(
                f"Agent '{agent.name}' keeps its state on the client, signed {problem}."
            )
    if problems:
        if not dev:
            raise InsecureKeyError(" ".join([*problems, _HOW_TO_CONFIGURE]))
        for problem in problems:
            logger.warning("%s Accepted because of --dev: never do this in production.", problem)
    return key_ids
