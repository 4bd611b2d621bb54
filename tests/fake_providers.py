"""Local stand-ins for the OpenAI and Anthropic HTTP APIs, for the model-adapter tests.

Each :class:`FakeProvider` is a Starlette app served by uvicorn on 127.0.0.1 (a real socket,
so the real SDKs talk to it over HTTP through ``base_url``). It speaks the provider's wire
format — JSON responses, the SSE streaming formats, the error bodies and status codes — shaped
like the providers' documented responses, and it enforces a few of the documented request
rules (tool results must answer every tool call, Anthropic's roles alternate, ...), answering
a violation with the provider's 400 as the real API would.

What to answer comes from a script (a queue of :class:`Reply` objects, one per request);
when the script is empty, the *brain* answers: the request is decoded back into Turnstile
messages and given to the :class:`~engine.ScriptedModel`, whose answer is rendered in the
provider's format. So the engine's behaviour suite, written against the scripted model, runs
unchanged over each adapter and a real HTTP connection. Every request is recorded, so tests
assert what the adapters sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine import ScriptedModel
from engine.conversation.parts import Message, Part
from engine.model import ModelRequest, TransientModelError

CREATED = 1764547200  # a fixed `created` timestamp keeps fixtures reproducible


@dataclass
class Call:
    """One tool call of a scripted answer; ``arguments`` is the raw JSON text sent."""

    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """One scripted response.

    ``kind``: ``answer`` (text and/or calls, rendered streamed or whole as the request asks),
    ``error`` (HTTP ``status`` with the provider's error ``body``), ``stream_error`` (a 200
    stream that breaks off with an error event), ``hang`` (answer nothing for ``delay``
    seconds), or ``brain`` (let the scripted model answer).
    """

    kind: str = "brain"
    text: str | None = None
    calls: list[Call] = field(default_factory=list)
    finish: str | None = None
    usage: tuple[int, int] = (11, 7)
    #: Split each call's argument text into pieces of this many characters when streaming.
    arg_chunk: int = 0
    #: Interleave the argument pieces of several calls (index-based assembly must cope).
    interleave: bool = False
    #: OpenAI only: leave ``index`` out of streamed tool-call deltas (as lax servers do).
    omit_index: bool = False
    #: OpenAI only: a refusal message (the ``refusal`` field / delta) instead of content.
    refusal: str | None = None
    status: int = 200
    body: dict[str, Any] | None = None
    delay: float = 0.0


@dataclass
class Recorded:
    """A request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeProvider:
    """Base class: the server, the script and the recording. Subclasses speak a wire format."""

    routes: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.brain = ScriptedModel(slow_chunk_delay=0)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Serve on a free port of 127.0.0.1 in a background thread."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        app = Starlette(
            routes=[Route(path, self._handle, methods=["POST"]) for path in self.routes]
        )
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", ws="none", http="h11", access_log=False
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True)
        self._thread.start()
        while not server.started:
            threading.Event().wait(0.01)

    def stop(self) -> None:
        """Stop the server and wait for its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

    def reset(self) -> None:
        """Forget the script, the recording and the brain's memory (between tests)."""
        self.script.clear()
        self.requests.clear()
        self.brain = ScriptedModel(slow_chunk_delay=0)

    @property
    def url(self) -> str:
        """The origin (``http://127.0.0.1:<port>``)."""
        return f"http://127.0.0.1:{self.port}"

    # -- handling ---------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(Recorded(request.url.path, dict(request.headers), body))
        reply = self.script.popleft() if self.script else Reply()
        if reply.kind == "hang":
            await asyncio.sleep(reply.delay)
        if reply.kind == "error":
            return JSONResponse(reply.body, status_code=reply.status, headers=self.error_headers())
        problem = self.validate(body)
        if problem is not None:
            return JSONResponse(self.error_body("invalid_request_error", problem), 400)
        if reply.kind == "brain":
            try:
                reply = await self.think(body)
            except TransientModelError as exc:
                return JSONResponse(self.overloaded(str(exc)), status_code=self.overload_status)
            except RuntimeError as exc:
                return JSONResponse(self.error_body("invalid_request_error", str(exc)), 400)
        streamed = bool(body.get("stream"))
        if reply.kind == "stream_error":
            return self.sse(self.broken_stream(reply, body))
        if streamed:
            return self.sse(self.stream_events(reply, body))
        return JSONResponse(self.whole(reply, body))

    async def think(self, body: dict[str, Any]) -> Reply:
        """Ask the scripted model, given the request decoded back into Turnstile messages."""
        messages = self.decode(body)
        chunks: list[str] = []

        async def collect(parts: list[Part]) -> None:
            chunks.extend(p.text for p in parts if p.text is not None)

        answer = await self.brain.generate(ModelRequest(messages=messages), collect)
        calls = [
            Call(p.tool_request.ref or "", p.tool_request.name, json.dumps(p.tool_request.input))
            for p in answer.message.content
            if p.tool_request is not None
        ]
        text = answer.message.text or None
        return Reply(kind="answer", text=text, calls=calls, usage=(10 * len(messages), 5))

    @staticmethod
    def sse(events: Any) -> StreamingResponse:
        return StreamingResponse(events, media_type="text/event-stream")

    @staticmethod
    def text_pieces(text: str) -> list[str]:
        """Word chunks, as the scripted model streams them."""
        return [piece for piece in re.split("(?<= )", text) if piece]

    @staticmethod
    def arg_pieces(reply: Reply, arguments: str) -> list[str]:
        if reply.arg_chunk <= 0:
            return [arguments]
        size = reply.arg_chunk
        return [arguments[i : i + size] for i in range(0, len(arguments), size)]

    # -- provider specifics (subclasses) ------------------------------------------------

    overload_status = 503

    def decode(self, body: dict[str, Any]) -> list[Message]:
        raise NotImplementedError

    def validate(self, body: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def whole(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def stream_events(self, reply: Reply, body: dict[str, Any]) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover

    async def broken_stream(self, reply: Reply, body: dict[str, Any]) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover

    def error_body(self, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def overloaded(self, message: str) -> dict[str, Any]:
        raise NotImplementedError

    def error_headers(self) -> dict[str, str]:
        return {}


def _tool_names(messages: list[Message]) -> dict[str, str]:
    return {
        p.tool_request.ref: p.tool_request.name
        for m in messages
        for p in m.content
        if p.tool_request is not None and p.tool_request.ref is not None
    }


class FakeOpenAI(FakeProvider):
    """``POST /v1/chat/completions`` as OpenAI documents it."""

    routes = ("/v1/chat/completions",)

    def decode(self, body: dict[str, Any]) -> list[Message]:
        messages: list[Message] = []
        for entry in body["messages"]:
            role = entry["role"]
            if role in ("system", "developer"):
                messages.append(Message(role="system", content=[Part.of_text(entry["content"])]))
            elif role == "user":
                content = entry["content"]
                if isinstance(content, list):
                    content = "".join(c.get("text", "") for c in content)
                messages.append(Message.user(content))
            elif role == "assistant":
                parts = [Part.of_text(entry["content"])] if entry.get("content") else []
                for call in entry.get("tool_calls") or []:
                    function = call["function"]
                    parts.append(
                        Part.of_request(function["name"], call["id"], _loads(function["arguments"]))
                    )
                messages.append(Message(role="model", content=parts))
            elif role == "tool":
                names = _tool_names(messages)
                part = Part.of_response(
                    names.get(entry["tool_call_id"], "?"),
                    entry["tool_call_id"],
                    _loads(entry["content"]),
                )
                if messages and messages[-1].role == "tool":
                    messages[-1].content.append(part)
                else:
                    messages.append(Message(role="tool", content=[part]))
        return messages

    def validate(self, body: dict[str, Any]) -> str | None:
        for tool in body.get("tools") or []:
            if tool.get("type") != "function" or tool["function"]["parameters"].get("type") != (
                "object"
            ):
                return f"Invalid schema for function '{tool['function'].get('name')}'."
        entries = body["messages"]
        for position, entry in enumerate(entries):
            wanted = {c["id"] for c in entry.get("tool_calls") or []}
            if not wanted:
                continue
            answered = set()
            for later in entries[position + 1 :]:
                if later["role"] != "tool":
                    break
                answered.add(later["tool_call_id"])
            if wanted - answered:
                return (
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(sorted(wanted - answered))}"
                )
        return None

    def _finish(self, reply: Reply) -> str:
        return reply.finish or ("tool_calls" if reply.calls else "stop")

    def _usage(self, reply: Reply) -> dict[str, int]:
        prompt, completion = reply.usage
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def whole(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": reply.refusal,
        }
        if reply.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in reply.calls
            ]
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": CREATED,
            "model": body["model"],
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish(reply),
                }
            ],
            "usage": self._usage(reply),
        }

    def _chunk(self, body: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": body["model"],
            "system_fingerprint": "fp_fake",
            "choices": choices,
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk["usage"] = None  # every chunk but the last carries "usage": null
        chunk.update(extra)
        return f"data: {json.dumps(chunk)}\n\n"

    def _delta(self, body: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
        return self._chunk(
            body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )

    async def stream_events(self, reply: Reply, body: dict[str, Any]) -> Any:
        yield self._delta(body, {"role": "assistant", "content": "", "refusal": None})
        for piece in self.text_pieces(reply.text or ""):
            yield self._delta(body, {"content": piece})
        for piece in self.text_pieces(reply.refusal or ""):
            yield self._delta(body, {"refusal": piece})
        pieces: list[tuple[int, str]] = []
        for index, call in enumerate(reply.calls):
            head: dict[str, Any] = {
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            if reply.omit_index:  # such servers send each call whole, right after its head
                del head["index"]
                head["function"]["arguments"] = call.arguments
                yield self._delta(body, {"tool_calls": [head]})
                continue
            yield self._delta(body, {"tool_calls": [head]})
            pieces += [(index, p) for p in self.arg_pieces(reply, call.arguments)]
        if reply.interleave:  # round-robin over the calls: assembly must go by index
            groups = [[p for p in pieces if p[0] == i] for i in range(len(reply.calls))]
            pieces = [p for row in itertools.zip_longest(*groups) for p in row if p is not None]
        for index, piece in pieces:
            fragment: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
            if reply.omit_index:
                del fragment["index"]
            yield self._delta(body, {"tool_calls": [fragment]})
        yield self._delta(body, {}, self._finish(reply))
        if (body.get("stream_options") or {}).get("include_usage"):
            yield self._chunk(body, [], usage=self._usage(reply))
        yield "data: [DONE]\n\n"

    async def broken_stream(self, reply: Reply, body: dict[str, Any]) -> Any:
        yield self._delta(body, {"role": "assistant", "content": "Let me "})
        yield f"data: {json.dumps({'error': reply.body})}\n\n"

    def error_body(self, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def overloaded(self, message: str) -> dict[str, Any]:
        return self.error_body("server_error", message)


class FakeAnthropic(FakeProvider):
    """``POST /v1/messages`` as Anthropic documents it."""

    routes = ("/v1/messages",)
    overload_status = 529
    _ID = re.compile(r"^[a-zA-Z0-9_-]+$")

    def decode(self, body: dict[str, Any]) -> list[Message]:
        messages: list[Message] = []
        system = body.get("system")
        if system:
            text = system if isinstance(system, str) else "".join(b["text"] for b in system)
            messages.append(Message(role="system", content=[Part.of_text(text)]))
        for entry in body["messages"]:
            blocks = entry["content"]
            if isinstance(blocks, str):
                blocks = [{"type": "text", "text": blocks}]
            if entry["role"] == "assistant":
                parts = []
                for block in blocks:
                    if block["type"] == "text":
                        parts.append(Part.of_text(block["text"]))
                    elif block["type"] == "tool_use":
                        parts.append(Part.of_request(block["name"], block["id"], block["input"]))
                messages.append(Message(role="model", content=parts))
                continue
            names = _tool_names(messages)
            results = [
                Part.of_response(
                    names.get(b["tool_use_id"], "?"), b["tool_use_id"], _loads(b["content"])
                )
                for b in blocks
                if b["type"] == "tool_result"
            ]
            if results:
                messages.append(Message(role="tool", content=results))
            texts = [Part.of_text(b["text"]) for b in blocks if b["type"] == "text"]
            if texts:
                messages.append(Message(role="user", content=texts))
        return messages

    def validate(self, body: dict[str, Any]) -> str | None:
        if "max_tokens" not in body:
            return "max_tokens: Field required"
        for tool in body.get("tools") or []:
            if tool["input_schema"].get("type") != "object":
                return f"tools.{tool['name']}.input_schema.type: Input should be 'object'"
        entries = body["messages"]
        for position, entry in enumerate(entries):
            expected = "user" if position % 2 == 0 else "assistant"
            if entry["role"] != expected:
                return 'messages: roles must alternate between "user" and "assistant"'
            blocks = entry["content"] if isinstance(entry["content"], list) else []
            for block in blocks:
                if block["type"] == "text" and not block["text"]:
                    return f"messages.{position}: text content blocks must be non-empty"
                if block["type"] == "tool_use" and not self._ID.match(block["id"]):
                    return f"messages.{position}.content.id: String should match pattern"
            uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
            if uses:
                following = entries[position + 1]["content"] if position + 1 < len(entries) else []
                answered = {b.get("tool_use_id") for b in following if isinstance(b, dict)}
                if uses - answered:
                    return (
                        f"messages.{position + 1}: `tool_use` ids were found without "
                        "`tool_result` blocks immediately after: "
                        + ", ".join(sorted(uses - answered))
                    )
        return None

    def _stop(self, reply: Reply) -> str:
        return reply.finish or ("tool_use" if reply.calls else "end_turn")

    def _content(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": json.loads(call.arguments),
                }
            )
        return blocks

    def whole(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": self._content(reply),
            "stop_reason": self._stop(reply),
            "stop_sequence": None,
            "usage": {"input_tokens": reply.usage[0], "output_tokens": reply.usage[1]},
        }

    @staticmethod
    def _event(kind: str, data: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

    def _start(self, reply: Reply, body: dict[str, Any]) -> str:
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": reply.usage[0], "output_tokens": 1},
        }
        return self._event("message_start", {"message": message})

    async def stream_events(self, reply: Reply, body: dict[str, Any]) -> Any:
        yield self._start(reply, body)
        index = 0
        if reply.text:
            yield self._event(
                "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
            )
            yield self._event("ping", {})
            for piece in self.text_pieces(reply.text):
                delta = {"type": "text_delta", "text": piece}
                yield self._event("content_block_delta", {"index": 0, "delta": delta})
            yield self._event("content_block_stop", {"index": 0})
            index = 1
        for call in reply.calls:
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            yield self._event("content_block_start", {"index": index, "content_block": block})
            for piece in ["", *self.arg_pieces(reply, call.arguments)]:
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield self._event("content_block_delta", {"index": index, "delta": delta})
            yield self._event("content_block_stop", {"index": index})
            index += 1
        yield self._event(
            "message_delta",
            {
                "delta": {"stop_reason": self._stop(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.usage[1]},
            },
        )
        yield self._event("message_stop", {})

    async def broken_stream(self, reply: Reply, body: dict[str, Any]) -> Any:
        yield self._start(reply, body)
        yield self._event(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        )
        assert reply.body is not None
        yield f"event: error\ndata: {json.dumps(reply.body)}\n\n"

    def error_body(self, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def overloaded(self, message: str) -> dict[str, Any]:
        return self.error_body("overloaded_error", message)

    def error_headers(self) -> dict[str, str]:
        return {"request-id": "req_fake"}


def _loads(text: Any) -> Any:
    """Tool arguments / results as JSON, or the raw text when they are not JSON."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def openai_model(server: FakeOpenAI, **options: Any) -> Any:
    """The real OpenAIChatModel (real SDK) pointed at ``server``, SDK retries off."""
    from engine.models import OpenAIChatModel

    settings: dict[str, Any] = {
        "base_url": f"{server.url}/v1",
        "api_key": "sk-test",
        "max_retries": 0,
        "timeout": 10.0,
    }
    return OpenAIChatModel("gpt-4o-mini", **{**settings, **options})


def anthropic_model(server: FakeAnthropic, **options: Any) -> Any:
    """The real AnthropicModel (real SDK) pointed at ``server``, SDK retries off."""
    from engine.models import AnthropicModel

    settings: dict[str, Any] = {
        "base_url": server.url,
        "api_key": "sk-ant-test",
        "max_retries": 0,
        "timeout": 10.0,
    }
    return AnthropicModel("claude-sonnet-4-5", **{**settings, **options})
