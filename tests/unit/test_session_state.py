"""The RFC 6902 patches of custom state, and the live state a turn's tools share."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engine.conversation.session_state import (
    Artifact,
    LiveState,
    RelayedPatches,
    SessionData,
    apply_patch,
    diff_patch,
)
from engine.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (None, {"a": 1}),
        ({"a": 1, "b": 2}, {"a": 1}),
        ({"a": 1}, {"a": 1, "c/d~e": [1, 2]}),
        ({"n": {"x": 1, "y": [1]}}, {"n": {"x": 2, "y": [1, 2]}}),
        ({"a": 1}, [1, 2]),
        ({"a": 1}, None),
        ({"a": True}, {"a": 1}),
    ],
)
def test_a_diff_applied_to_the_old_value_gives_the_new(old: Any, new: Any) -> None:
    """Whatever the change, ``apply_patch(old, diff_patch(old, new)) == new``."""
    result = apply_patch(old, diff_patch(old, new))
    assert result == new and type(result) is type(new)


def test_diff_names_only_the_changed_members() -> None:
    """Unchanged members produce no operation; pointers escape ``/`` and ``~``."""
    assert diff_patch({"a": 1, "b": 2}, {"a": 1, "b": 3, "c/~": 4}) == [
        {"op": "replace", "path": "/b", "value": 3},
        {"op": "add", "path": "/c~1~0", "value": 4},
    ]
    assert diff_patch({"a": 1}, {"a": 1}) == []


def test_a_patch_that_does_not_apply_is_invalid_argument() -> None:
    """Removing a missing member is refused with a typed error, not a KeyError."""
    with pytest.raises(InvalidArgumentError):
        apply_patch({"a": 1}, [{"op": "remove", "path": "/b"}])


def test_live_state_streams_whole_value_first_then_diffs_and_records_effects() -> None:
    """The first change of a turn streams as a root replace; each change is an effect of the
    call that made it; replaying the effects rebuilds the state."""
    live = LiveState(SessionData(custom={"n": 0}))
    effects: list[dict[str, Any]] = []
    live.update_custom(lambda s: {**s, "n": 1}, effects)
    live.update_custom({"n": 1}, effects)  # no change: nothing streamed or recorded
    live.update_custom(lambda s: {**s, "n": 2}, effects)
    live.add_artifact({"name": "a", "parts": [{"text": "x"}]}, effects)
    assert live.take_chunks() == [
        {"customPatch": [{"op": "replace", "path": "", "value": {"n": 1}}]},
        {"customPatch": [{"op": "replace", "path": "/n", "value": 2}]},
        {"artifact": {"name": "a", "parts": [{"text": "x"}]}},
    ]
    rebuilt = LiveState(SessionData(custom={"n": 0}))
    rebuilt.replay(effects)
    assert rebuilt.data() == live.data()
    assert rebuilt.take_chunks() == []
    assert live.take_changed() is not None and live.take_changed() is None


def test_an_artifact_of_a_taken_name_replaces_it_in_place() -> None:
    """Genkit's rule: same name, same position, new content; unnamed ones are appended."""
    live = LiveState(SessionData())
    effects: list[dict[str, Any]] = []
    for artifact in (
        {"name": "a", "parts": [{"text": "1"}]},
        {"name": "b", "parts": [{"text": "2"}]},
        {"name": "a", "parts": [{"text": "3"}]},
        {"parts": [{"text": "4"}]},
    ):
        live.add_artifact(artifact, effects)
    assert [a.to_wire() for a in live.artifacts] == [
        {"name": "a", "parts": [{"text": "3"}]},
        {"name": "b", "parts": [{"text": "2"}]},
        {"parts": [{"text": "4"}]},
    ]
    with pytest.raises(InvalidArgumentError):
        Artifact.coerce({"parts": "not a list"})


def test_relayed_patches_hold_back_what_no_longer_applies_and_rebase_at_the_end() -> None:
    """After a lost patch, a later one that does not apply is held back (and every one after
    it); the end brings a whole-value replace. With nothing lost there is none."""
    intact = RelayedPatches({"n": 0})
    assert intact.admit({"customPatch": [{"op": "replace", "path": "/n", "value": 1}]})
    assert intact.admit({"artifact": {"parts": []}})
    assert intact.rebase({"n": 1}) is None

    lossy = RelayedPatches(None)  # the whole-value patch making {"n": 1} was lost
    assert not lossy.admit({"customPatch": [{"op": "replace", "path": "/n", "value": 2}]})
    assert not lossy.admit({"customPatch": [{"op": "replace", "path": "", "value": {}}]})
    assert lossy.rebase({"n": 2}) == {
        "customPatch": [{"op": "replace", "path": "", "value": {"n": 2}}]
    }


def test_concurrent_updates_from_threads_lose_no_change() -> None:
    """Tools in threads of their own update at once: each update starts from the value the
    previous one left (the read-modify-write is atomic), so no increment is lost."""
    live = LiveState(SessionData(custom={"n": 0}))

    def bump(effects: list[dict[str, Any]]) -> None:
        def slow_increment(state: Any) -> Any:
            time.sleep(0.001)  # widens the window a racy read-modify-write would lose in
            return {"n": state["n"] + 1}

        for _ in range(20):
            live.update_custom(slow_increment, effects)

    threads = [threading.Thread(target=bump, args=([],)) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert live.custom == {"n": 100}
