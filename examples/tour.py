"""A tour of the API in memory: approve, deny, then approve two transfers at once.

Run it with ``python -m examples.tour`` (``make tour``). With a terminal on stdin the tour
asks you y/n for each approval; without one, or with ``--yes``, it answers by itself. It runs
offline: the scripted model stands in for the LLM and sessions live in the in-memory store.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from engine import AgentInterrupt, AgentResponse, Chat, Part, TurnstileError
from examples.banking import BankingApp, build

DEMO_STATE_KEYS = {"demo": "demo-key-not-secret"}
CARD_WIDTH = 60


def bold(text: str) -> str:
    """``text`` in ANSI bold when stdout is a terminal, else unchanged (plain text)."""
    return f"\033[1m{text}\033[0m" if sys.stdout.isatty() else text


@dataclass(frozen=True)
class Decider:
    """Who answers the approval cards: the human at the terminal, or the demo itself."""

    interactive: bool

    async def decide(self, default: bool, *, scripted: bool = False) -> bool:
        """Ask y/n (returning the answer) or, when automatic or scripted, take ``default``."""
        hint = "Y/n" if default else "y/N"
        if scripted or not self.interactive:
            why = "scripted" if scripted else "automatic"
            print(f"  Approve? [{hint}] {'y' if default else 'n'}  ({why})")
            return default
        while True:
            answer = (await read_line(f"  Approve? [{hint}] ")).strip().lower()
            if not answer:
                return default
            if answer in ("y", "yes", "n", "no"):
                return answer.startswith("y")
            print("  Please answer y or n.")


async def read_line(prompt: str) -> str:
    """Print ``prompt`` and await a line of stdin without blocking the loop, so Ctrl-C works.

    Raises :class:`EOFError` at end of input.
    """
    print(prompt, end="", flush=True)
    loop, fd = asyncio.get_running_loop(), sys.stdin.fileno()
    got: asyncio.Future[str] = loop.create_future()

    def on_ready() -> None:
        if not got.done():
            got.set_result(sys.stdin.readline())

    loop.add_reader(fd, on_ready)  # POSIX only, like the rest of Turnstile's tooling
    try:
        line = await got
    finally:
        loop.remove_reader(fd)
    if not line:
        raise EOFError
    return line


def approval_card(interrupt: AgentInterrupt) -> str:
    """The pending approval as a human sees it: a small box with the interrupt's input."""
    action = getattr(interrupt.input, "action", None)
    details = getattr(interrupt.input, "details", None)
    rows = [
        f"Interrupt: {interrupt.name}  (ref {interrupt.ref})",
        f"Action:    {action if action is not None else '-'}",
        f"Details:   {details if details is not None else interrupt.raw_input}",
    ]
    width = max(CARD_WIDTH, *(len(row) + 4 for row in rows))
    title = "-- Approval needed "
    lines = ["  +" + title + "-" * (width - 2 - len(title)) + "+"]
    lines += [f"  | {row.ljust(width - 4)} |" for row in rows]
    lines.append("  +" + "-" * (width - 2) + "+")
    return "\n".join(lines)


def describe_tool_chunk(part: Part) -> str | None:
    """One line for a streamed tool request or result (None for anything else)."""
    if part.tool_request is not None and part.tool_request.name == "transferMoney":
        args = part.tool_request.input or {}
        return f"  [agent calls transferMoney: ${args.get('amount')} to {args.get('toAccount')}]"
    if part.tool_response is not None and part.tool_response.name == "transferMoney":
        output = part.tool_response.output or {}
        return f"  [transferMoney ran: transaction {output.get('transactionId')}]"
    return None


async def resume_streaming(chat: Chat, respond: Sequence[Part]) -> AgentResponse:
    """Resume with ``respond``, showing tool activity and streaming the reply word by word."""
    turn = chat.resume_stream(respond=respond)
    speaking = False
    async for chunk in turn.stream:
        for part in chunk.content:
            line = describe_tool_chunk(part)
            if line is not None:
                print(("\n" if speaking else "") + line)
                speaking = False
        if chunk.role == "model" and chunk.text:
            if not speaking:
                print("  Agent: ", end="")
                speaking = True
            print(chunk.text, end="", flush=True)
    if speaking:
        print()
    return await turn.response


async def play(
    app: BankingApp,
    decider: Decider,
    *,
    title: str,
    message: str,
    default: bool,
    scripted: bool = False,
    feedback: str = "Declined at the terminal",
) -> AgentResponse:
    """One scene: send ``message``, show each approval card, decide, and resume until done."""
    print("\n" + bold(f"== {title} =="))
    if scripted:
        print(f"  (scripted scene: the answer is always a denial, feedback {feedback!r})")
    chat = app.banking_agent.chat()
    before = len(app.transfers)
    print(f"  You:   {message}")
    res = await chat.send(message)
    while res.interrupts:
        count = len(res.interrupts)
        need = "1 approval" if count == 1 else f"{count} approvals"
        print(f"  Agent paused (finish reason {res.finish_reason}): {need} needed.\n")
        respond: list[Part] = []
        for interrupt in res.interrupts:
            print(approval_card(interrupt))
            approved = await decider.decide(default, scripted=scripted)
            verdict = "approved" if approved else f"denied ({feedback})"
            print(f"  -> {interrupt.ref}: {verdict}\n")
            output = {"approved": True} if approved else {"approved": False, "feedback": feedback}
            respond.append(interrupt.respond(output))
        answers = "1 answer" if len(respond) == 1 else f"all {len(respond)} answers"
        print(f"  Resuming with {answers} in one call (streaming)...")
        res = await resume_streaming(chat, respond)
    ran = app.transfers[before:]
    ledger = ", ".join(f"${t.amount:,.2f} to {t.toAccount}" for _, t in ran)
    print(f"  Ledger: {ledger or 'no transfer ran'}.")
    return res


async def summary(app: BankingApp, last: AgentResponse) -> None:
    """The last turn's snapshot as the store holds it, and every transfer that ran."""
    print("\n" + bold("== Summary =="))
    if last.snapshot_id is not None:
        snapshot = await app.banking_agent.get_snapshot(snapshot_id=last.snapshot_id)
        if snapshot is not None:
            print(f"  Last snapshot {snapshot.snapshot_id}")
            print(f"    status: {snapshot.status}, finish reason: {snapshot.finish_reason}")
            print(f"    {len(snapshot.state.messages)} messages in session {snapshot.session_id}")
    print(f"  Transfers executed: {len(app.transfers)}")
    for key, transfer in app.transfers:
        amount = f"${transfer.amount:,.2f}"
        print(f"    {amount:>9} to {transfer.toAccount:<20} idempotency key {key}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: only ``--yes``."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.tour", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--yes", action="store_true", help="answer every approval automatically (no prompts)"
    )
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    """Run the three scenes and the summary; return the process exit code."""
    args = parse_args(argv)
    interactive = sys.stdin.isatty() and not args.yes
    decider = Decider(interactive=interactive)
    app = build(state_keys=DEMO_STATE_KEYS)

    print(bold("Turnstile demo: approval-gated transfers with bankingAgent"))
    print("  Offline: scripted model, in-memory session store.")
    if not interactive:
        reason = "--yes" if args.yes else "no TTY"
        print(f"  ({reason}: answering automatically)")
    try:
        await play(
            app,
            decider,
            title="Scene 1: Approve a transfer",
            message="Transfer $500 to my savings account.",
            default=True,
        )
        await play(
            app,
            decider,
            title="Scene 2: Deny a transfer",
            message="Transfer $1200 to my vacation fund.",
            default=False,
            scripted=True,
            feedback="Not this month",
        )
        last = await play(
            app,
            decider,
            title="Scene 3: Two transfers, one resume",
            message="Transfer $50 to Alice and $75 to Bob",
            default=True,
        )
        await summary(app, last)
    except EOFError:
        print("\n  Stopped: end of input.")
        return 1
    except TurnstileError as error:
        print(f"\nerror: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        print("\n  Stopped.")
        sys.exit(130)
