"""The engine's behaviour suite over each model: scripted, OpenAI and Anthropic adapters.

The test functions are the unit tier's (imported, so pytest collects them here too). The
``app`` fixture below overrides the default one: the banking app runs on the scripted model
directly, and on :class:`~engine.models.OpenAIChatModel` and
:class:`~engine.models.AnthropicModel` talking over real HTTP to the local fake provider,
whose answers come from the same scripted rules. Passing the same suite means the adapters'
mapping (messages, tools, ids, streaming) loses nothing the engine relies on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.fake_providers import FakeAnthropic, FakeOpenAI, anthropic_model, openai_model
from tests.unit.test_interrupts import (  # noqa: F401 - collected again over each model
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
    test_stream_of_a_stateless_agent_carries_state_in_the_response,
    test_tool_request_streams_as_one_chunk,
)
from tests.unit.test_turn_lifecycle import (  # noqa: F401
    test_abort_of_a_settled_snapshot_is_a_no_op,
    test_get_snapshot_by_session_returns_the_latest,
    test_reopened_session_continues_the_conversation,
)


@pytest.fixture(params=["scripted", "openai", "anthropic"])
async def app(
    request: pytest.FixtureRequest, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> AsyncIterator[BankingApp]:
    """The banking app on each model (the adapters' HTTP clients closed afterwards)."""
    model: Any = None
    if request.param == "openai":
        model = openai_model(fake_openai)
    elif request.param == "anthropic":
        model = anthropic_model(fake_anthropic)
    yield build(model=model, state_keys=TEST_STATE_KEYS)
    if model is not None:
        await model.aclose()


@pytest.fixture(autouse=True)
def _went_over_http(
    request: pytest.FixtureRequest, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> Iterator[None]:
    """After each adapter run, the fake provider must have been asked (no silent fallback)."""
    yield None
    kind = request.node.callspec.params.get("app")
    server = {"openai": fake_openai, "anthropic": fake_anthropic}.get(kind)
    if server is not None:
        assert server.requests, f"the {kind} adapter never reached its fake server"
