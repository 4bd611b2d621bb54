"""The engine's behaviour suite, re-run with the banking app on the SQL stores.

The test functions are the unit tier's (imported, so pytest collects them here too); the
``app`` fixture below overrides the in-memory one, so every test that takes ``app`` runs on
SQLite and on PostgreSQL with the turn executed in this process against the durable store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.unit.test_interrupts import (  # noqa: F401 - collected again against SQL stores
    test_a_second_transfer_in_the_same_session_gets_a_fresh_ref,
    test_denial_cancels_and_runs_nothing,
    test_finished_sibling_output_is_kept_and_replayed_not_rerun,
    test_respond_answers_without_running_the_interrupt,
    test_send_pauses_at_the_approval_interrupt,
    test_several_interrupts_answered_in_one_resume,
)
from tests.unit.test_resume_validation import (  # noqa: F401
    test_an_interrupt_is_answered_only_once,
    test_invalid_resume_is_rejected_and_writes_nothing,
    test_new_message_while_paused_is_rejected,
    test_resume_of_a_snapshot_that_is_not_paused_is_rejected,
    test_resume_with_a_new_message_is_rejected,
)
from tests.unit.test_streaming import (  # noqa: F401
    test_send_stream_yields_word_chunks_then_the_response,
    test_tool_request_streams_as_one_chunk,
)
from tests.unit.test_turn_lifecycle import (  # noqa: F401
    test_abort_of_a_settled_snapshot_is_a_no_op,
    test_get_snapshot_by_session_returns_the_latest,
    test_reopened_session_continues_the_conversation,
)


@pytest.fixture(params=["sqlite", "postgres"])
async def app(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """The banking app on a fresh SQL database, turns executed in this process."""
    async with sql_store(request.param) as store:
        yield build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
