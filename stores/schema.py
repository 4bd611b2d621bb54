"""The SQL schema, as SQLAlchemy Core tables (Alembic's autogenerate compares against it).

Names are part of the public contract (operators and their scripts rely on them): tables
``sessions``, ``turns``, ``messages``, ``tool_calls``, ``turn_events``; the PostgreSQL ENUM
``turn_status`` mirrors :class:`engine.status.TurnStatus`. Views, and the triggers that keep
``approval_queue`` exact, are not part of this metadata: the migrations create them
(``migrations/versions``), their current definitions are in :mod:`stores.views` and
:mod:`stores.triggers`, and ``docs/schema.md`` documents them.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import SchemaItem

from engine.status import TurnStatus
from engine.store import ToolCallStatus

__all__ = [
    "ACTIVE",
    "BIG_ID",
    "JSON",
    "ONLY_ON",
    "SESSION_ID",
    "TIMESTAMP",
    "TURN_ID",
    "agent_definitions",
    "approval_assignments",
    "approval_queue",
    "approval_votes",
    "messages",
    "metadata",
    "sessions",
    "tool_calls",
    "turn_events",
    "turns",
    "ui_login_failures",
    "ui_sessions",
    "webhook_deliveries",
]

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: JSONB on PostgreSQL (queryable with ->, ->>, @>), JSON text on SQLite. Python's None is
#: stored as SQL NULL (``IS NULL`` finds it), not as the JSON value ``null``.
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
#: A turn's id and every column holding one. PostgreSQL orders it by bytes (collation "C",
#: migration 0021) so that the primary key also serves a prefix search (``LIKE 'ab12%'``);
#: a column compared with it must share the collation, or the comparison could not use that
#: column's own index. SQLite's default collation already compares bytes.
TURN_ID = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")

#: A session's id and every column holding one: in byte order too, for the same reason
#: (migration 0024: ``turns ls --session`` takes an id's first characters).
SESSION_ID = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")

#: A 64-bit identity: SQLite's ``INTEGER PRIMARY KEY`` is one already (and only that spelling
#: makes a column its rowid).
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

#: Key of an index's ``info``: the one dialect whose databases have the index (the migrations
#: create it there alone; ``migrations/env.py`` leaves it out of the comparison elsewhere).
ONLY_ON = "only_on"

turn_status = sa.Enum(
    *[s.value for s in TurnStatus],
    name="turn_status",
    create_constraint=True,
    validate_strings=True,
)
tool_call_status = sa.Enum(
    *[s.value for s in ToolCallStatus],
    name="tool_call_status",
    create_constraint=True,
    validate_strings=True,
)

ACTIVE = (TurnStatus.PENDING.value, TurnStatus.ABORTING.value)


def _partial_index(name: str, *columns: str, where: str, unique: bool = False) -> sa.Index:
    """An index of the rows ``where`` holds for, with that condition on both databases."""
    return sa.Index(
        name,
        *columns,
        unique=unique,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def _approval_key() -> tuple[SchemaItem, ...]:
    """The key of a table about approvals: the journal row's ``(turn_id, round, ref)``, whose
    foreign key makes retention (and any delete of a journal row) take the table's rows with
    it."""
    return (
        sa.Column("turn_id", TURN_ID, primary_key=True),
        sa.Column("round", sa.Integer, primary_key=True),
        sa.Column("ref", sa.Text, primary_key=True),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            ondelete="CASCADE",
        ),
    )


sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", SESSION_ID, primary_key=True),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("owner", sa.Text),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    sa.Column("updated_at", TIMESTAMP, nullable=False),
    # A requester's runs page finds her sessions, then their turns (migration 0016).
    sa.Index("ix_sessions_owner", "owner"),
    comment="One conversation with one agent: a chain (or tree) of turns.",
)

turns = sa.Table(
    "turns",
    metadata,
    sa.Column("id", TURN_ID, primary_key=True, comment="The snapshot id."),
    sa.Column("session_id", SESSION_ID, sa.ForeignKey("sessions.id"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False, comment="1, 2, ... within the session."),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("parent_id", TURN_ID, sa.ForeignKey("turns.id")),
    sa.Column("status", turn_status, nullable=False),
    sa.Column("finish_reason", sa.Text),
    sa.Column("input", JSON, nullable=False),
    sa.Column("error", JSON),
    sa.Column("history_length", sa.Integer, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="1"),
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_expires_at", TIMESTAMP),
    sa.Column("run_after", TIMESTAMP, nullable=False),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    sa.Column("updated_at", TIMESTAMP, nullable=False),
    sa.Column("settled_at", TIMESTAMP),
    # Token usage summed over the turn's model calls (migration 0002); NULL when unreported.
    sa.Column(
        "input_tokens",
        sa.Integer,
        comment="Prompt tokens of all model calls of the turn, as the provider reported them.",
    ),
    sa.Column(
        "output_tokens",
        sa.Integer,
        comment="Completion tokens of all model calls of the turn, as reported.",
    ),
    # The creating request's trace (migration 0005); NULL when it was made outside a trace.
    sa.Column(
        "trace_context",
        JSON,
        comment="W3C trace context (traceparent, tracestate) of the request that created it.",
    ),
    # Genkit's session state (migration 0009), written with the round that changed it.
    sa.Column(
        "custom",
        JSON,
        comment="The custom state (Genkit's state.custom) as of the last committed round.",
    ),
    sa.Column(
        "artifacts",
        JSON,
        comment="The session's artifacts [{name, parts, metadata}] as of the last committed round.",
    ),
    # What the turn is pinned to (migration 0011); NULL on turns created before pinning.
    sa.Column(
        "app_version",
        sa.Text,
        comment="The application version whose workers may run the turn.",
    ),
    sa.Column(
        "definition_fingerprint",
        sa.Text,
        comment="Hash of the agent definition the turn is pinned to (agent_definitions).",
    ),
    sa.UniqueConstraint("session_id", "seq"),
    # Claiming scans only pending rows, oldest run_after first.
    _partial_index("ix_turns_claimable", "run_after", "id", where="status = 'pending'"),
    # At most one running (pending/aborting) turn per session: the database enforces it.
    _partial_index(
        "ux_turns_one_active_per_session",
        "session_id",
        where="status IN ('pending', 'aborting')",
        unique=True,
    ),
    # Aborting turns whose worker died are settled by the next claim: find them cheaply. Their
    # ids only: indexing lease_expires_at made every claim and heartbeat a non-HOT update
    # (migration 0004).
    _partial_index("ix_turns_aborting", "id", where="status = 'aborting'"),
    # A turn's children (a resume of it, retention, the foreign key's check), found by
    # equality: a session's first turn, without a parent, needs no entry (migration 0025).
    _partial_index("ix_turns_parent_id", "parent_id", where="parent_id IS NOT NULL"),
    # `turnstile turns ls` pages newest first (migration 0012).
    sa.Index("ix_turns_created_at", "created_at", "id"),
    # ... and its pages of the few turns that failed or were aborted (migration 0012).
    _partial_index(
        "ix_turns_failed_or_aborted",
        "created_at",
        "id",
        where="status IN ('failed', 'aborted')",
    ),
    # The queued turns of one version: `turnstile turns migrate`, queue depth by version (the
    # paused ones are found through approval_queue; migration 0012).
    _partial_index(
        "ix_turns_version_pending",
        "app_version",
        "agent",
        where="status = 'pending'",
    ),
    # PostgreSQL: fillfactor = 80 (migration 0004; SQLAlchemy's Table has no storage
    # parameters), room on each page for a lease update's new row version (a HOT update).
    comment="One row per turn = per snapshot; status is the turn state machine.",
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("turn_id", TURN_ID, sa.ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("round", sa.Integer, primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("content", JSON, nullable=False),
    sa.Column("metadata", JSON),
    sa.Column("committed", sa.Boolean, nullable=False),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    comment="The conversation, one row per message, by the turn and round that wrote it.",
)

tool_calls = sa.Table(
    "tool_calls",
    metadata,
    sa.Column("turn_id", TURN_ID, sa.ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("round", sa.Integer, primary_key=True),
    sa.Column("ref", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("input", JSON),
    sa.Column("status", tool_call_status, nullable=False),
    sa.Column("output", JSON),
    sa.Column("interrupt", JSON),
    sa.Column("error", JSON),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("resumed", JSON),
    sa.Column("answer", JSON),
    sa.Column("decided_by", sa.Text),
    sa.Column("decided_at", TIMESTAMP),
    sa.Column("started_at", TIMESTAMP),
    sa.Column("finished_at", TIMESTAMP),
    sa.Column("deadline", TIMESTAMP),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    sa.Column(
        "effects",
        JSON,
        comment="What the call changed: [{customPatch: [ops]} | {artifact: {...}}], in order.",
    ),
    # Open approvals and expiry only ever look at interrupted calls.
    _partial_index("ix_tool_calls_open", "created_at", where="status = 'interrupted'"),
    _partial_index(
        "ix_tool_calls_deadline",
        "deadline",
        where="status = 'interrupted' AND deadline IS NOT NULL",
    ),
    # The history of decisions (migration 0007) reads it backwards: newest decision first.
    _partial_index(
        "ix_tool_calls_decided",
        "decided_at",
        "turn_id",
        "ref",
        where="decided_at IS NOT NULL",
    ),
    comment="The journal: one row per tool request, keyed by (turn, round, ref).",
)

agent_definitions = sa.Table(
    "agent_definitions",
    metadata,
    sa.Column("fingerprint", sa.Text, primary_key=True),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("definition", JSON, nullable=False),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    comment="Each agent definition turns were pinned to, once per fingerprint (migration 0011).",
)

turn_events = sa.Table(
    "turn_events",
    metadata,
    # The order entries were appended in. PostgreSQL keys the table by (turn_id, id), the
    # order every reader reads it in; SQLite keys it by id, its rowid, which numbers the
    # entries (a composite key would leave id unnumbered there), and reads it by
    # ix_turn_events_turn_id (migration 0023).
    sa.Column("id", BIG_ID, sa.Identity(), nullable=False),
    sa.Column("turn_id", TURN_ID, sa.ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    sa.Column("from_status", turn_status),
    # On an entry that is not a transition: the status the turn was in (migration 0013).
    sa.Column("to_status", turn_status, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("at", TIMESTAMP, nullable=False),
    # The history beyond status transitions (migration 0013).
    sa.Column(
        "kind",
        sa.Text,
        nullable=False,
        server_default="status",
        comment="What happened: status, claimed, lease lost, tool started, decided, vote, ...",
    ),
    sa.Column(
        "actor",
        sa.Text,
        comment="Who did it: the worker holding the attempt, or the principal deciding.",
    ),
    sa.Column("detail", JSON, comment="What the entry is about, as data (its call, answer...)."),
    sa.PrimaryKeyConstraint("turn_id", "id", name="pk_turn_events"),
    sa.Index("ix_turn_events_turn_id", "turn_id", "id", info={ONLY_ON: "sqlite"}),
    comment="Every turn's history, append-only: transitions, claims, tool calls, decisions.",
)

# Written only by the triggers of stores/triggers.py.
approval_queue = sa.Table(
    "approval_queue",
    metadata,
    *_approval_key(),
    sa.Column("session_id", SESSION_ID, nullable=False, comment="The turn's session (copied)."),
    sa.Column("agent", sa.Text, nullable=False, comment="The turn's agent (copied)."),
    sa.Column("name", sa.Text, nullable=False, comment="The interrupt's name."),
    sa.Column("input", JSON, comment="What the approver sees."),
    sa.Column("interrupt", JSON, comment="The interrupt's metadata."),
    sa.Column("deadline", TIMESTAMP),
    sa.Column(
        "decided_at",
        TIMESTAMP,
        comment="Set by an inbox decision (the inbox hides decided entries).",
    ),
    sa.Column("created_at", TIMESTAMP, nullable=False, comment="When the call was journaled."),
    sa.Column(
        "turn_created_at",
        TIMESTAMP,
        nullable=False,
        comment="The turn's created_at (copied; migration 0018).",
    ),
    sa.Column(
        "turn_app_version", sa.Text, comment="The turn's app_version (copied; migration 0022)."
    ),
    # The view's order and the inbox's keyset pages.
    sa.Index("ix_approval_queue_created_at", "created_at", "turn_id", "ref"),
    # The paused turns newest first, as turns ls lists them (0018): a page reads its entries.
    sa.Index("ix_approval_queue_turn_created_at", "turn_created_at", "turn_id"),
    # A new turn deletes its session's older entries (the supersede trigger).
    sa.Index("ix_approval_queue_session_id", "session_id"),
    # The metrics' open approvals per agent, oldest first, without the decided ones (0012).
    _partial_index("ix_approval_queue_open", "agent", "created_at", where="decided_at IS NULL"),
    comment=(
        "The open approvals (the rows of the view open_approvals), kept by triggers on "
        "tool_calls and turns."
    ),
)

approval_votes = sa.Table(
    "approval_votes",
    metadata,
    *_approval_key(),
    # One vote per approver and approval: the key makes a second vote by the same approver fail.
    sa.Column("voter", sa.Text, primary_key=True, comment="The approver's principal id."),
    sa.Column("answer", JSON, comment="The vote's answer ({'respond': ...} or {'restart': ...})."),
    sa.Column(
        "approves",
        sa.Boolean,
        nullable=False,
        comment="Counts towards the quorum; any other vote decided the approval.",
    ),
    sa.Column("voted_at", TIMESTAMP, nullable=False),
    comment="Votes on approvals whose interrupt has an approval policy (migration 0006).",
)

ui_sessions = sa.Table(
    "ui_sessions",
    metadata,
    sa.Column("id", sa.Text, primary_key=True, comment="What the signed cookie carries."),
    sa.Column("principal", sa.Text, nullable=False, comment="Who signed in."),
    sa.Column("roles", JSON, nullable=False, comment="The principal's roles at sign-in."),
    sa.Column("csrf", sa.Text, nullable=False, comment="The session's CSRF token."),
    sa.Column("created_at", TIMESTAMP, nullable=False),
    sa.Column("last_seen_at", TIMESTAMP, nullable=False),
    sa.Column("expires_at", TIMESTAMP, nullable=False, comment="The absolute end."),
    sa.Column("revoked_at", TIMESTAMP, comment="Logout or an operator's revoke; NULL: not."),
    sa.Column("user_agent", sa.Text, nullable=False, server_default=""),
    sa.Column("client_address", sa.Text, nullable=False, server_default=""),
    sa.Index("ix_ui_sessions_principal", "principal"),
    sa.Index("ix_ui_sessions_expires_at", "expires_at"),
    comment="Signed-in browsers of the inbox UI (migration 0008).",
)

ui_login_failures = sa.Table(
    "ui_login_failures",
    metadata,
    sa.Column("key", sa.Text, primary_key=True, comment="'address:...' or 'account:...'."),
    sa.Column(
        "failures",
        sa.Integer,
        nullable=False,
        comment="Sign-in attempts in the window not known to have succeeded.",
    ),
    sa.Column("window_started_at", TIMESTAMP, nullable=False),
    comment="Failed sign-ins of the inbox UI per client address and account (migration 0008).",
)


approval_assignments = sa.Table(
    "approval_assignments",
    metadata,
    *_approval_key(),
    sa.Column("assignee", sa.Text, comment="The principal holding the approval (claimed)."),
    sa.Column("assigned_group", sa.Text, comment="The group (role) the approval is assigned to."),
    sa.Column(
        "assigned_by", sa.Text, comment="Who made the last change ('escalation': the sweep)."
    ),
    sa.Column("assigned_at", TIMESTAMP, comment="When the last change was made."),
    sa.Column(
        "escalated_at", TIMESTAMP, comment="When the last step of the escalation chain moved it."
    ),
    sa.Column("escalated_from_assignee", sa.Text, comment="The assignee before the escalation."),
    sa.Column("escalated_from_group", sa.Text, comment="The group before the escalation."),
    sa.Column("escalated_to", sa.Text, comment="The group the escalation moved it to."),
    sa.Column(
        "escalation_step",
        sa.Integer,
        nullable=False,
        server_default="0",
        comment="The step of the escalation chain reached (0: not escalated); migration 0015.",
    ),
    sa.Column(
        "last_reminded_at",
        TIMESTAMP,
        comment="When the last reminder was logged (one per interval across workers).",
    ),
    sa.Column("reminders", sa.Integer, nullable=False, server_default="0"),
    comment="Assignment, escalation and reminders of approvals (migration 0010).",
)

webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.Text, primary_key=True, comment="Derived from event_id and url."),
    sa.Column("event_id", sa.Text, nullable=False, comment="The event's id, alike for each url."),
    sa.Column("event", sa.Text, nullable=False, comment="opened, reminded, escalated, decided."),
    sa.Column("turn_id", TURN_ID, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("ref", sa.Text, nullable=False),
    sa.Column("url", sa.Text, nullable=False, comment="The endpoint (its secret is not stored)."),
    sa.Column("body", sa.Text, nullable=False, comment="The request body every attempt sends."),
    sa.Column("occurred_at", TIMESTAMP, nullable=False, comment="When the event happened."),
    sa.Column(
        "status",
        sa.Text,
        nullable=False,
        server_default="pending",
        comment="pending, delivered, or failed (attempts exhausted).",
    ),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", TIMESTAMP, nullable=False, comment="Due from then on."),
    sa.Column("lease_token", sa.Text, comment="The claim of the worker sending it now."),
    sa.Column("lease_expires_at", TIMESTAMP, comment="When another worker may claim it again."),
    sa.Column("last_error", sa.Text, comment="Why the last attempt failed."),
    sa.Column("delivered_at", TIMESTAMP, comment="When the endpoint accepted it."),
    sa.ForeignKeyConstraint(
        ["turn_id", "round", "ref"],
        ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
        ondelete="CASCADE",
    ),
    # A turn's deliveries, and whether an approval was announced as opened.
    sa.Index("ix_webhook_deliveries_turn_id", "turn_id", "round", "ref", "event"),
    # The deliveries due, oldest first: what a worker claims, and the pending gauge.
    _partial_index("ix_webhook_deliveries_due", "next_attempt_at", where="status = 'pending'"),
    # The newest approval announced as opened (the sweep's watermark).
    _partial_index("ix_webhook_deliveries_opened", "occurred_at", where="event = 'opened'"),
    comment="The outbox of webhook deliveries about approvals (migration 0014).",
)
