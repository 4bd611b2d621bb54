"""Log lines: the turn context (engine/telemetry/log_context.py) and the process's formats
(workers/logs.py), through the standard logging machinery."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.telemetry.log_context import TurnContextFilter, current_turn, turn_context
from workers.logs import JsonFormatter, configure_logging


class _Turn:
    """What turn_context reads of a turn record."""

    def __init__(self, turn_id: str, session_id: str = "s-1", agent: str = "bankingAgent"):
        self.id = turn_id
        self.session_id = session_id
        self.agent = agent


@pytest.fixture
def json_lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose records go through the filter and the JSON formatter into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TurnContextFilter())
    logger = logging.getLogger("turnstile.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def _parsed(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_json_line_has_the_base_keys_and_no_turn_fields_outside_a_turn(
    json_lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = json_lines
    logger.warning("plain %s", "line")
    (line,) = _parsed(out)
    assert line["level"] == "WARNING"
    assert line["logger"] == "turnstile.test_logs"
    assert line["message"] == "plain line"
    assert datetime.fromisoformat(line["ts"]).tzinfo == UTC
    assert not {"turn_id", "session_id", "agent"} & line.keys()


def test_lines_inside_a_turn_carry_its_fields_and_the_context_ends_with_the_block(
    json_lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = json_lines
    with turn_context(_Turn("t-1")) as fields:
        assert current_turn() == fields
        logger.info("inside")
        with turn_context(_Turn("t-2", "s-2", "other")):
            logger.info("nested")
        logger.info("inside again")
    logger.info("after")
    assert current_turn() is None
    inside, nested, again, after = _parsed(out)
    assert (inside["turn_id"], inside["session_id"], inside["agent"]) == (
        "t-1",
        "s-1",
        "bankingAgent",
    )
    assert (nested["turn_id"], nested["session_id"], nested["agent"]) == ("t-2", "s-2", "other")
    assert again["turn_id"] == "t-1"
    assert "turn_id" not in after


async def test_tasks_started_inside_a_turn_keep_its_fields(
    json_lines: tuple[logging.Logger, io.StringIO],
) -> None:
    """asyncio copies the context into a task: a heartbeat or a tool call started by the turn
    logs as part of it, even after the block that started it has ended."""
    logger, out = json_lines
    go_on = asyncio.Event()

    async def later() -> None:
        await go_on.wait()
        logger.info("from the task")

    with turn_context(_Turn("t-task")):
        task = asyncio.create_task(later())
    logger.info("outside")
    go_on.set()
    await task
    outside, from_task = _parsed(out)
    assert "turn_id" not in outside
    assert from_task["turn_id"] == "t-task"


def test_extra_fields_are_kept_and_exceptions_formatted(
    json_lines: tuple[logging.Logger, io.StringIO],
) -> None:
    """``extra=`` values appear as keys (a record's own turn_id is not overwritten); an
    exception becomes one JSON string; the line stays one line."""
    logger, out = json_lines
    with turn_context(_Turn("t-ctx")):
        logger.info("claimed", extra={"attempt": 2, "turn_id": "t-extra", "when": datetime.now()})
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        logger.exception("failed")
    assert len(out.getvalue().splitlines()) == 2
    claimed, failed = _parsed(out)
    assert claimed["attempt"] == 2
    assert claimed["turn_id"] == "t-extra"
    assert claimed["session_id"] == "s-1"
    assert isinstance(claimed["when"], str)
    assert "ValueError: broken\nacross lines" in failed["exception"]


def test_configure_logging_routes_every_logger_through_one_handler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Any logger — uvicorn's too — comes out in the chosen format on stderr; a second call
    replaces the handler instead of doubling every line; chatty libraries are held to
    warnings except at DEBUG."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        configure_logging("INFO", "json")
        handler = configure_logging("info", "json")
        assert sum(h is handler for h in root.handlers) == 1
        assert len([h for h in root.handlers if type(h) is type(handler)]) == 1
        logging.getLogger("uvicorn.error").info("Started server process [1]")
        logging.getLogger("apscheduler.scheduler").info("job ran")
        (line,) = [json.loads(text) for text in capsys.readouterr().err.splitlines()]
        assert (line["logger"], line["message"]) == ("uvicorn.error", "Started server process [1]")

        configure_logging("DEBUG", "text")
        logging.getLogger("apscheduler.scheduler").debug("job ran")
        text = capsys.readouterr().err
        assert " DEBUG   apscheduler.scheduler: job ran" in text
    finally:
        for installed in list(root.handlers):
            if installed not in saved[1]:
                root.removeHandler(installed)
        root.setLevel(saved[0])
        for name in ("apscheduler", "alembic"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format must be one of text, json"):
        configure_logging("INFO", "xml")


def test_a_line_logged_inside_a_span_carries_its_trace_id(
    json_lines: tuple[logging.Logger, io.StringIO],
) -> None:
    """With OpenTelemetry recording a span, engine.telemetry.tracing.current_trace_id() names its
    trace and every line gets it as trace_id; outside a span there is none."""
    from opentelemetry.sdk.trace import TracerProvider

    logger, out = json_lines
    tracer = TracerProvider().get_tracer("tests.test_logs")
    with tracer.start_as_current_span("turn") as span:
        logger.info("inside a span")
    logger.info("outside")
    inside, outside = _parsed(out)
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert "trace_id" not in outside


def test_uvicorns_own_logging_configuration_is_undone(capsys: pytest.CaptureFixture[str]) -> None:
    """A uvicorn server started earlier in the process with its default logging config leaves
    handlers on its loggers and stops them propagating; configuring ours undoes that, so its
    lines come out once, in our format."""
    import logging.config

    import uvicorn.config

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved_uvicorn = {
        n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate) for n in names
    }
    try:
        logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
        configure_logging("INFO", "json")
        logging.getLogger("uvicorn.error").info("Started server process [2]")
        lines = capsys.readouterr().err.splitlines()
        assert [json.loads(line)["message"] for line in lines] == ["Started server process [2]"]
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, (handlers, propagate) in saved_uvicorn.items():
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).propagate = propagate
