"""The engine's behaviour suite: the unit tests that every way of running the banking app
must pass unchanged.

A module re-runs the suite by star-importing this one (pytest collects the imported test
functions there too) and defining an ``app`` fixture that overrides the default in-memory
app: SQL stores (``tests/integration/test_behaviour_sql.py``), real model adapters
(``tests/integration/test_model_adapters_behaviour.py``), remote agents over HTTP
(``tests/acceptance/test_remote_parity.py``).
"""

from __future__ import annotations

from tests.unit.test_interrupts import (
    test_a_second_transfer_in_the_same_session_gets_a_fresh_ref,
    test_denial_cancels_and_runs_nothing,
    test_finished_sibling_output_is_kept_and_replayed_not_rerun,
    test_respond_answers_without_running_the_interrupt,
    test_send_pauses_at_the_approval_interrupt,
    test_several_interrupts_answered_in_one_resume,
)
from tests.unit.test_resume_validation import (
    test_an_interrupt_is_answered_only_once,
    test_invalid_resume_is_rejected_and_writes_nothing,
    test_new_message_while_paused_is_rejected,
    test_resume_of_a_snapshot_that_is_not_paused_is_rejected,
    test_resume_with_a_new_message_is_rejected,
)
from tests.unit.test_streaming import (
    test_send_stream_yields_word_chunks_then_the_response,
    test_stream_of_a_stateless_agent_carries_state_in_the_response,
    test_tool_request_streams_as_one_chunk,
)
from tests.unit.test_turn_lifecycle import (
    test_abort_of_a_settled_snapshot_is_a_no_op,
    test_get_snapshot_by_session_returns_the_latest,
    test_reopened_session_continues_the_conversation,
)

__all__ = [
    "test_a_second_transfer_in_the_same_session_gets_a_fresh_ref",
    "test_abort_of_a_settled_snapshot_is_a_no_op",
    "test_an_interrupt_is_answered_only_once",
    "test_denial_cancels_and_runs_nothing",
    "test_finished_sibling_output_is_kept_and_replayed_not_rerun",
    "test_get_snapshot_by_session_returns_the_latest",
    "test_invalid_resume_is_rejected_and_writes_nothing",
    "test_new_message_while_paused_is_rejected",
    "test_reopened_session_continues_the_conversation",
    "test_respond_answers_without_running_the_interrupt",
    "test_resume_of_a_snapshot_that_is_not_paused_is_rejected",
    "test_resume_with_a_new_message_is_rejected",
    "test_send_pauses_at_the_approval_interrupt",
    "test_send_stream_yields_word_chunks_then_the_response",
    "test_several_interrupts_answered_in_one_resume",
    "test_stream_of_a_stateless_agent_carries_state_in_the_response",
    "test_tool_request_streams_as_one_chunk",
]
