"""StateSigner: signed, session-bound, rotatable client-managed state blobs."""

from __future__ import annotations

import copy
import json
import logging
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, ScriptedModel
from engine.errors import InvalidStateError
from engine.state.signing import SIGNATURE_FIELD, StateSigner, canonical_json
from engine.store.memory import InMemorySessionStore
from stores.settings import read_settings

AGENT = "bankingAgentStateless"
KEYS = {"k1": "secret-one-0123456789"}
NOW = 1_700_000_000

#: A real interrupted state of ``bankingAgentStateless`` (a parallel round: ``transferMoney``
#: ran and keeps its ``pendingOutput``, ``userApproval`` waits), plus ``custom`` data.
REALISTIC_STATE: dict[str, Any] = {
    "sessionId": "12bc4e4b-8a59-4ba5-91cf-f79d6f08ac96",
    "messages": [
        {"role": "user", "content": [{"text": "hello"}]},
        {"role": "model", "content": [{"text": "Echo: hello"}]},
        {"role": "user", "content": [{"text": "Parallel transfer $500 to my savings account"}]},
        {
            "role": "model",
            "content": [
                {
                    "toolRequest": {
                        "name": "transferMoney",
                        "ref": "transfer-1",
                        "input": {"amount": 500.0, "toAccount": "my savings account"},
                    },
                    "metadata": {
                        "pendingOutput": {
                            "success": True,
                            "transactionId": "txn-500-my-savings-account",
                        }
                    },
                },
                {
                    "toolRequest": {
                        "name": "userApproval",
                        "ref": "approval-1",
                        "input": {
                            "action": "transferMoney",
                            "details": "Transfer $500 to my savings account",
                        },
                    },
                    "metadata": {"interrupt": True},
                },
            ],
        },
    ],
    "custom": {"tier": "gold", "limits": [1000, 2.5, None, False]},
    "artifacts": [],
}


def signer(keys: dict[str, str | bytes] | None = None, **kwargs: Any) -> StateSigner:
    """A signer with explicit keys (``KEYS`` by default)."""
    return StateSigner(KEYS if keys is None else keys, **kwargs)


def signed(state: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """``state`` (the realistic one by default) signed with ``KEYS`` for ``AGENT`` at ``NOW``."""
    return signer().sign(
        REALISTIC_STATE if state is None else state, agent=AGENT, now=NOW, **kwargs
    )


def js_round_trip(value: Any) -> Any:
    """What a JavaScript client echoes back: ``JSON.parse(JSON.stringify(value))``.

    JavaScript has one number type: an integral double below 1e21 is written without a
    fraction (``500.0`` → ``500``), so Python reads it back as an ``int``.
    """

    def js(node: Any) -> Any:
        if isinstance(node, float) and node.is_integer() and abs(node) < 1e21:
            return int(node)
        if isinstance(node, dict):
            return {k: js(v) for k, v in node.items()}
        if isinstance(node, list):
            return [js(v) for v in node]
        return node

    return json.loads(json.dumps(js(value)))


# -- mutation strategy (shared with test_client_state) ----------------------------------

Path = tuple[str | int, ...]

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
#: Printable ASCII: a one-character edit of the signature stays within what a client sends.
SIGNATURE_CHARS = string.digits + string.ascii_letters + string.punctuation + " "


def _nodes(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _nodes(child, (*path, index))


def _edit(blob: dict[str, Any], path: Path, change: Callable[[Any], Any]) -> dict[str, Any]:
    """A deep copy of ``blob`` whose node at ``path`` is replaced by ``change(node)``.

    ``change`` may also mutate the node in place and return it.
    """
    copied = copy.deepcopy(blob)
    if not path:
        changed: dict[str, Any] = change(copied)
        return changed
    parent: Any = copied
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = change(parent[path[-1]])
    return copied


def _different(old: Any) -> st.SearchStrategy[Any]:
    """JSON values that differ from ``old`` after canonicalisation (``1`` and ``1.0`` don't)."""
    return json_values.filter(lambda new: canonical_json(new) != canonical_json(old))


def _without_key(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def drop(node: dict[str, Any]) -> dict[str, Any]:
        del node[key]
        return node

    return drop


def _with_key(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def add(node: dict[str, Any]) -> dict[str, Any]:
        node[key] = value
        return node

    return add


def _without_index(index: int) -> Callable[[list[Any]], list[Any]]:
    def drop(node: list[Any]) -> list[Any]:
        del node[index]
        return node

    return drop


@st.composite
def mutated_blobs(draw: st.DrawFn, blob: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One single mutation of a signed ``blob``: ``(what was done, the mutated copy)``.

    Changes a leaf (other than the signature) to a different value, deletes a key, adds a
    key, drops a list element, truncates ``messages``, changes one character of the
    signature, or replaces ``sessionId``.
    """
    nodes = list(_nodes(blob))
    leaves = [
        (path, value)
        for path, value in nodes
        if path != (SIGNATURE_FIELD,) and (not isinstance(value, dict | list) or not value)
    ]
    dicts = [(path, value) for path, value in nodes if isinstance(value, dict)]
    keyed = [(path, key) for path, value in dicts for key in value]
    indexed = [
        (path, index)
        for path, value in nodes
        if isinstance(value, list)
        for index in range(len(value))
    ]
    kinds = ["leaf", "add-key", "signature-char", "session-id"]
    kinds += ["delete-key"] if keyed else []
    kinds += ["drop-element"] if indexed else []
    kinds += ["truncate-messages"] if blob.get("messages") else []
    kind = draw(st.sampled_from(kinds))

    if kind == "leaf":
        path, old = draw(st.sampled_from(leaves))
        new = draw(_different(old))
        return f"set {list(path)} to {new!r}", _edit(blob, path, lambda _: new)
    if kind == "delete-key":
        path, key = draw(st.sampled_from(keyed))
        return f"delete {[*path, key]}", _edit(blob, path, _without_key(key))
    if kind == "add-key":
        path, node = draw(st.sampled_from(dicts))
        key = draw(st.text(max_size=8).filter(lambda k: k not in node))
        value = draw(json_values)
        return f"add {[*path, key]} = {value!r}", _edit(blob, path, _with_key(key, value))
    if kind == "drop-element":
        path, index = draw(st.sampled_from(indexed))
        return f"drop {[*path, index]}", _edit(blob, path, _without_index(index))
    if kind == "truncate-messages":
        keep = draw(st.integers(min_value=0, max_value=len(blob["messages"]) - 1))
        return f"keep {keep} messages", _edit(blob, ("messages",), lambda m: m[:keep])
    if kind == "signature-char":
        signature = blob[SIGNATURE_FIELD]
        index = draw(st.integers(min_value=0, max_value=len(signature) - 1))
        char = draw(st.sampled_from(SIGNATURE_CHARS).filter(lambda c: c != signature[index]))
        forged = signature[:index] + char + signature[index + 1 :]
        return f"signature {forged!r}", _edit(blob, (SIGNATURE_FIELD,), lambda _: forged)
    session = draw(st.text(max_size=40).filter(lambda s: s != blob["sessionId"]))
    return f"sessionId {session!r}", _edit(blob, ("sessionId",), lambda _: session)


# -- generated states -------------------------------------------------------------------

parts = st.one_of(
    st.builds(lambda t: {"text": t}, st.text(max_size=20)),
    st.fixed_dictionaries(
        {
            "toolRequest": st.fixed_dictionaries(
                {"name": st.text(min_size=1, max_size=10), "ref": st.text(max_size=8)},
                optional={"input": json_values},
            )
        },
        optional={"metadata": st.dictionaries(st.text(max_size=12), json_values, max_size=2)},
    ),
)
messages = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "model", "tool"]),
        "content": st.lists(parts, max_size=3),
    }
)
states = st.fixed_dictionaries(
    {
        "sessionId": st.text(min_size=1, max_size=36),
        "messages": st.lists(messages, max_size=4),
        "artifacts": st.lists(json_values, max_size=2),
    },
    optional={"custom": json_values},
)


# -- round trip and shape ---------------------------------------------------------------


def test_sign_then_verify_returns_the_state() -> None:
    """A signed blob verifies and gives back the state without the signature."""
    blob = signed()
    state = signer().verify(blob, agent=AGENT, now=NOW)
    assert SIGNATURE_FIELD not in state
    assert canonical_json(state) == canonical_json(REALISTIC_STATE)
    assert state["sessionId"] == REALISTIC_STATE["sessionId"]


def test_blob_keeps_session_state_shape_plus_one_signature_field() -> None:
    """The blob holds Genkit's SessionState fields unchanged plus a single `signature`."""
    minimal = {"sessionId": "s-1", "messages": [], "artifacts": []}
    blob = signer().sign(minimal, agent=AGENT, now=NOW)
    assert set(blob) == {"sessionId", "messages", "artifacts", "signature"}
    full = signed()
    assert set(full) == {"sessionId", "messages", "custom", "artifacts", "signature"}
    assert full["messages"] == js_round_trip(REALISTIC_STATE["messages"])
    assert full["custom"] == REALISTIC_STATE["custom"]


def test_signature_names_version_key_and_issue_time() -> None:
    """The signature reads `ts1.<key id>.<issued-at>.<base64url MAC>`."""
    version, kid, issued, mac = signed()[SIGNATURE_FIELD].split(".")
    assert (version, kid, issued) == ("ts1", "k1", str(NOW))
    assert len(mac) == 43  # 32 bytes of HMAC-SHA256, base64url without padding
    assert set(mac) <= set(string.ascii_letters + string.digits + "-_")


def test_signing_a_signed_blob_replaces_its_signature() -> None:
    """Re-signing ignores the old `signature` field instead of covering it."""
    first = signed()
    again = signer().sign(first, agent=AGENT, now=NOW + 5)
    assert again[SIGNATURE_FIELD].split(".")[2] == str(NOW + 5)
    assert signer().verify(again, agent=AGENT, now=NOW + 5) == signer().verify(
        first, agent=AGENT, now=NOW
    )


def test_sign_does_not_mutate_its_input() -> None:
    """Signing leaves the caller's state object untouched."""
    state = copy.deepcopy(REALISTIC_STATE)
    signed(state)
    assert state == REALISTIC_STATE
    assert SIGNATURE_FIELD not in state


def test_integral_floats_survive_a_javascript_round_trip() -> None:
    """`500.0` signed, echoed back by JavaScript as `500`, still verifies."""
    state = {
        "sessionId": "s-js",
        "messages": [
            {
                "role": "model",
                "content": [{"toolRequest": {"name": "t", "input": {"amount": 500.0, "fee": 1.5}}}],
            }
        ],
        "artifacts": [],
    }
    blob = signer().sign(state, agent=AGENT, now=NOW)
    held = copy.deepcopy(blob)  # a Python holder that kept the float
    held["messages"][0]["content"][0]["toolRequest"]["input"]["amount"] = 500.0
    echoed = js_round_trip(held)
    assert echoed["messages"][0]["content"][0]["toolRequest"]["input"] == {
        "amount": 500,
        "fee": 1.5,
    }
    assert type(echoed["messages"][0]["content"][0]["toolRequest"]["input"]["amount"]) is int
    for variant in (blob, held, echoed):
        verified = signer().verify(variant, agent=AGENT, now=NOW)
        assert verified["messages"][0]["content"][0]["toolRequest"]["input"]["amount"] == 500


def test_changing_a_float_fraction_is_still_detected() -> None:
    """Canonicalisation only merges `500.0` with `500`: `500.5` is a different value."""
    blob = signed()
    tampered = copy.deepcopy(blob)
    tampered["custom"]["limits"][1] = 2.5000001
    with pytest.raises(InvalidStateError, match="does not match"):
        signer().verify(tampered, agent=AGENT, now=NOW)


def test_canonical_json_is_sorted_compact_and_merges_integral_floats() -> None:
    """Canonical JSON sorts keys, has no spaces and writes `1.0` as `1`."""
    assert (
        canonical_json({"b": 1.0, "a": [True, None, "é"]}) == '{"a":[true,null,"é"],"b":1}'.encode()
    )
    assert canonical_json({"x": 1}) == canonical_json({"x": 1.0})
    assert canonical_json({"x": 1}) != canonical_json({"x": True})


def test_non_finite_numbers_cannot_be_signed() -> None:
    """NaN has no JSON form, so a state holding one is refused."""
    with pytest.raises(InvalidStateError, match="non-finite"):
        signer().sign({"sessionId": "s", "custom": float("nan")}, agent=AGENT, now=NOW)


# -- key rotation -------------------------------------------------------------------------


def test_blob_signed_with_old_key_verifies_after_rotation() -> None:
    """A signer listing [new, old] still accepts blobs the old key signed."""
    old_blob = StateSigner({"old": "old-secret-0123456789"}).sign(
        REALISTIC_STATE, agent=AGENT, now=NOW
    )
    rotated = StateSigner({"new": "new-secret-0123456789", "old": "old-secret-0123456789"})
    assert (
        rotated.verify(old_blob, agent=AGENT, now=NOW)["sessionId"] == REALISTIC_STATE["sessionId"]
    )


def test_new_blobs_are_signed_with_the_first_key() -> None:
    """After rotation the first listed key signs, and the old key alone cannot verify it."""
    rotated = StateSigner({"new": "new-secret-0123456789", "old": "old-secret-0123456789"})
    assert rotated.active_key_id == "new"
    blob = rotated.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert blob[SIGNATURE_FIELD].split(".")[1] == "new"
    assert StateSigner({"new": "new-secret-0123456789"}).verify(blob, agent=AGENT, now=NOW)
    with pytest.raises(InvalidStateError, match="unknown key 'new'"):
        StateSigner({"old": "old-secret-0123456789"}).verify(blob, agent=AGENT, now=NOW)


def test_retired_key_is_rejected_naming_the_key() -> None:
    """A signer that dropped the old key rejects its blobs with a message naming the key id."""
    old_blob = StateSigner({"old": "old-secret-0123456789"}).sign(
        REALISTIC_STATE, agent=AGENT, now=NOW
    )
    with pytest.raises(InvalidStateError, match=r"unknown key 'old' \(foreign or retired\)"):
        StateSigner({"new": "new-secret-0123456789"}).verify(old_blob, agent=AGENT, now=NOW)


def test_same_key_id_with_another_secret_is_rejected() -> None:
    """A foreign server reusing the key id `k1` with its own secret cannot forge a blob."""
    foreign = StateSigner({"k1": "somebody-else-secret"}).sign(
        REALISTIC_STATE, agent=AGENT, now=NOW
    )
    with pytest.raises(InvalidStateError, match="does not match"):
        signer().verify(foreign, agent=AGENT, now=NOW)


def test_bytes_and_str_secrets_are_the_same_key() -> None:
    """A secret given as bytes signs exactly like the same secret given as text."""
    as_bytes = StateSigner({"k1": b"secret-one-0123456789"})
    assert as_bytes.sign(REALISTIC_STATE, agent=AGENT, now=NOW) == signed()


def test_key_id_with_a_dot_is_refused() -> None:
    """Key ids are plain ASCII names: no '.', the signature's field separator, or spaces."""
    for bad in ("k.1", "k 1", "ключ", ""):
        with pytest.raises(ValueError, match="must be 1-64 characters"):
            StateSigner({bad: "secret"})


# -- binding to the agent, expiry ---------------------------------------------------------


def test_blob_signed_for_one_agent_is_rejected_by_another() -> None:
    """The MAC covers the agent name: agent A's blob does not verify for agent B."""
    blob = signer().sign(REALISTIC_STATE, agent="agentA", now=NOW)
    assert signer().verify(blob, agent="agentA", now=NOW)
    with pytest.raises(InvalidStateError, match="not issued by agent 'agentB'"):
        signer().verify(blob, agent="agentB", now=NOW)


def test_max_age_accepts_a_fresh_blob_and_rejects_an_old_one() -> None:
    """With `max_age`, a blob verifies up to that age and is rejected as expired after it."""
    strict = signer(max_age=60)
    blob = strict.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert strict.verify(blob, agent=AGENT, now=NOW + 60)["sessionId"]
    with pytest.raises(InvalidStateError, match="expired: it is older than 60 seconds"):
        strict.verify(blob, agent=AGENT, now=NOW + 61)


def test_without_max_age_old_blobs_still_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `max_age` a blob never expires, whatever the environment says."""
    monkeypatch.setenv("TURNSTILE_STATE_MAX_AGE", "30")
    lenient = signer()
    assert lenient.max_age is None
    blob = lenient.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert lenient.verify(blob, agent=AGENT, now=NOW + 10 * 365 * 86400)


def test_max_age_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`TURNSTILE_STATE_MAX_AGE` sets the expiry of an engine given the settings' options."""
    monkeypatch.setenv("TURNSTILE_STATE_MAX_AGE", "30")
    options = read_settings().engine_options()
    options["state_keys"] = KEYS
    from_env = Engine(model=ScriptedModel(), **options).signer
    assert from_env.max_age == 30
    blob = from_env.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    with pytest.raises(InvalidStateError, match="expired"):
        from_env.verify(blob, agent=AGENT, now=NOW + 31)


# -- malformed blobs ----------------------------------------------------------------------


@pytest.mark.parametrize("blob", [None, [], "a blob", 42, ["sessionId", "signature"]])
def test_non_object_blob_is_rejected(blob: Any) -> None:
    """A state that is not a JSON object is rejected."""
    with pytest.raises(InvalidStateError, match="must be a JSON object") as caught:
        signer().verify(blob, agent=AGENT, now=NOW)
    assert caught.value.status == "INVALID_ARGUMENT"


@pytest.mark.parametrize("signature", ["<absent>", None, 123, ["ts1"], {"kid": "k1"}])
def test_missing_or_non_text_signature_is_rejected(signature: Any) -> None:
    """A blob without a string `signature` is rejected as unsigned."""
    blob = signed()
    if signature == "<absent>":
        del blob[SIGNATURE_FIELD]
    else:
        blob[SIGNATURE_FIELD] = signature
    with pytest.raises(InvalidStateError, match="not signed"):
        signer().verify(blob, agent=AGENT, now=NOW)


@pytest.mark.parametrize(
    "forge",
    [
        lambda sig: "",
        lambda sig: "garbage",
        lambda sig: sig.replace("ts1.", "ts2.", 1),
        lambda sig: sig.rsplit(".", 1)[0],
        lambda sig: sig + ".extra",
        lambda sig: sig.replace(f".{NOW}.", ".yesterday.", 1),
        lambda sig: sig.replace(f".{NOW}.", ".-5.", 1),
        lambda sig: sig.replace(f".{NOW}.", "..", 1),
    ],
    ids=[
        "empty",
        "garbage",
        "version",
        "no-mac",
        "extra-field",
        "word-time",
        "negative",
        "no-time",
    ],
)
def test_malformed_signature_is_rejected(forge: Callable[[str], str]) -> None:
    """A signature that is not `ts1.<kid>.<digits>.<mac>` is rejected as malformed."""
    blob = signed()
    blob[SIGNATURE_FIELD] = forge(blob[SIGNATURE_FIELD])
    with pytest.raises(InvalidStateError, match="malformed"):
        signer().verify(blob, agent=AGENT, now=NOW)


def test_wrong_mac_is_rejected() -> None:
    """A well-formed signature whose MAC is wrong is rejected as not matching."""
    blob = signed()
    head, mac = blob[SIGNATURE_FIELD].rsplit(".", 1)
    blob[SIGNATURE_FIELD] = f"{head}.{mac[::-1]}"
    with pytest.raises(InvalidStateError, match="does not match"):
        signer().verify(blob, agent=AGENT, now=NOW)


@pytest.mark.parametrize("session_id", ["<absent>", "", None, 7, ["s"]])
def test_missing_session_id_is_rejected_even_when_signed(session_id: Any) -> None:
    """A correctly signed state without a non-empty string sessionId is still rejected."""
    state = copy.deepcopy(REALISTIC_STATE)
    if session_id == "<absent>":
        del state["sessionId"]
    else:
        state["sessionId"] = session_id
    blob = signed(state)
    with pytest.raises(InvalidStateError, match="no sessionId"):
        signer().verify(blob, agent=AGENT, now=NOW)


# -- configuration --------------------------------------------------------------------------


def test_keys_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`TURNSTILE_STATE_KEYS='new:s1, old:s2'`, handed over by the settings, gives a signer
    that signs with `new` and verifies `old`."""
    monkeypatch.setenv("TURNSTILE_STATE_KEYS", " new:secret-new ,, old:secret:with:colons ")
    from_env = Engine(model=ScriptedModel(), **read_settings().engine_options()).signer
    assert from_env.active_key_id == "new"
    old_blob = StateSigner({"old": "secret:with:colons"}).sign(
        REALISTIC_STATE, agent=AGENT, now=NOW
    )
    assert from_env.verify(old_blob, agent=AGENT, now=NOW)
    new_blob = from_env.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert StateSigner({"new": "secret-new"}).verify(new_blob, agent=AGENT, now=NOW)


def test_the_signer_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys passed to the constructor are the keys; `TURNSTILE_STATE_KEYS` alone gives none."""
    monkeypatch.setenv("TURNSTILE_STATE_KEYS", "envkey:env-secret")
    assert signer().active_key_id == "k1"
    assert StateSigner().generated


@pytest.mark.parametrize(
    "spec", ["just-a-secret", ":secret", "kid:", "good:secret,bad", "good:secret, :x"]
)
def test_malformed_environment_keys_raise_value_error(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """A `TURNSTILE_STATE_KEYS` entry that is not `kid:secret` raises ValueError."""
    monkeypatch.setenv("TURNSTILE_STATE_KEYS", spec)
    with pytest.raises(ValueError, match="must look like 'kid1:secret1,kid2:secret2'"):
        read_settings()


def test_without_keys_an_ephemeral_key_is_used_and_logged_when_it_first_signs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No configured key gives a random per-process key; a warning is logged once, when it
    first signs (an app that never signs, with no client-managed agent, is not warned)."""
    monkeypatch.delenv("TURNSTILE_STATE_KEYS", raising=False)
    with caplog.at_level(logging.WARNING, logger="turnstile.signing"):
        first = StateSigner()
        assert not [r for r in caplog.records if r.name == "turnstile.signing"]
        blob = first.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
        first.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert first.active_key_id.startswith("ephemeral-")
    warnings = [r for r in caplog.records if r.name == "turnstile.signing"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "No state signing key configured" in warnings[0].getMessage()
    assert first.active_key_id in warnings[0].getMessage()
    assert first.verify(blob, agent=AGENT, now=NOW)
    second = StateSigner()
    assert second.active_key_id != first.active_key_id
    with pytest.raises(InvalidStateError, match="unknown key"):
        second.verify(blob, agent=AGENT, now=NOW)


def test_empty_key_mapping_also_falls_back_to_an_ephemeral_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An explicitly empty key mapping is treated as "no keys" (ephemeral key, warning)."""
    with caplog.at_level(logging.WARNING, logger="turnstile.signing"):
        ephemeral = StateSigner({})
        ephemeral.sign(REALISTIC_STATE, agent=AGENT, now=NOW)
    assert ephemeral.active_key_id.startswith("ephemeral-")
    assert any("No state signing key configured" in r.getMessage() for r in caplog.records)


# -- properties -------------------------------------------------------------------------------


@settings(max_examples=300)
@given(mutation=mutated_blobs(signed()))
def test_any_single_mutation_of_a_realistic_blob_is_rejected(
    mutation: tuple[str, dict[str, Any]],
) -> None:
    """Every single mutation of a real interrupted-turn blob makes verify raise."""
    _, tampered = mutation
    with pytest.raises(InvalidStateError):
        signer().verify(tampered, agent=AGENT, now=NOW)


@settings(max_examples=200)
@given(data=st.data(), state=states)
def test_any_single_mutation_of_a_generated_blob_is_rejected(
    data: st.DataObject, state: dict[str, Any]
) -> None:
    """Every single mutation of a signed generated state makes verify raise."""
    blob = signed(state)
    assert signer().verify(blob, agent=AGENT, now=NOW)  # the unmodified blob is fine
    _, tampered = data.draw(mutated_blobs(blob), label="mutation")
    with pytest.raises(InvalidStateError):
        signer().verify(tampered, agent=AGENT, now=NOW)


@given(state=states)
def test_generated_states_round_trip(state: dict[str, Any]) -> None:
    """Any JSON state signs and verifies back to the same canonical value."""
    blob = signed(state)
    assert canonical_json(signer().verify(blob, agent=AGENT, now=NOW)) == canonical_json(state)


safe_numbers = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1) | st.floats(
    min_value=-1e15, max_value=1e15, allow_nan=False
)


@given(
    numbers=st.lists(safe_numbers, max_size=8),
    session=st.text(min_size=1, max_size=12),
)
def test_javascript_round_trip_of_numbers_still_verifies(
    numbers: list[int | float], session: str
) -> None:
    """Numbers in JavaScript's safe range survive `JSON.parse(JSON.stringify(blob))`."""
    blob = signer().sign(
        {"sessionId": session, "messages": [], "artifacts": [], "custom": {"n": numbers}},
        agent=AGENT,
        now=NOW,
    )
    assert signer().verify(js_round_trip(blob), agent=AGENT, now=NOW)


# -- one spelling per signature (found by review: Unicode digits, padding, non-ASCII MACs) ----

_STRICT = StateSigner({"k1": "secret-one-0123456789"})
_NOW = 1_700_000_000


def _strict_blob(**custom: object) -> dict[str, object]:
    return _STRICT.sign(
        {"sessionId": "s", "messages": [], "artifacts": [], **custom}, agent="a", now=_NOW
    )


def test_non_ascii_character_in_the_mac_is_an_invalid_state() -> None:
    """A non-ASCII MAC is rejected as InvalidStateError, not a TypeError from hmac."""
    blob = _strict_blob()
    blob["signature"] = str(blob["signature"])[:-1] + "é"
    with pytest.raises(InvalidStateError):
        _STRICT.verify(blob, agent="a", now=_NOW)


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda t: chr(0x661) + t[1:],  # an Arabic-Indic digit
        lambda t: "".join(chr(0xFF10 + int(c)) for c in t),  # fullwidth digits
        lambda t: "0" + t,  # a leading zero
        lambda t: "²",  # a superscript digit
    ],
)
def test_the_issue_time_has_exactly_one_spelling(rewrite: Any) -> None:
    """Another spelling of the same issue time does not verify: signatures are not malleable."""
    blob = _strict_blob()
    version, kid, issued, mac = str(blob["signature"]).split(".")
    blob["signature"] = f"{version}.{kid}.{rewrite(issued)}.{mac}"
    with pytest.raises(InvalidStateError):
        _STRICT.verify(blob, agent="a", now=_NOW)


def test_large_integral_float_survives_a_javascript_round_trip() -> None:
    """JavaScript prints integral doubles below 1e21 as digits; such blobs still verify."""
    blob = _strict_blob(custom={"x": 2.0**60})
    _STRICT.verify({**blob, "custom": {"x": 2**60}}, agent="a", now=_NOW)


def test_an_engine_without_keys_and_without_client_state_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An app with only stored agents never signs: building it (as every CLI action does)
    says nothing about a signing key it does not need."""
    with caplog.at_level(logging.WARNING, logger="turnstile.signing"):
        ai = Engine(model=ScriptedModel())
        ai.define_agent(name="stored", store=InMemorySessionStore())
    assert not [r for r in caplog.records if r.name == "turnstile.signing"]
