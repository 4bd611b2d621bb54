"""The approval inbox in a browser: pages served at ``/ui`` by the same app as the API.

* ``/ui`` — open approvals the viewer may decide, filtered, ordered, paged, updated live;
* ``/ui/approvals/{id}`` — one approval, its conversation, and the decision form;
* ``/ui/turns/{id}`` — the turn inspector, with abort and retry;
* ``/ui/history`` (and ``/ui/history.csv``) — decided approvals;
* ``/ui/login``, ``/ui/logout`` — browser sessions when the server has an authenticator;
* ``/ui/events`` — server-sent events telling open pages that something changed.

Pages are rendered on the server and work without JavaScript; a small script of our own
(``static/ui.js``) adds live updates. See ``docs/inbox.md``.
"""

from __future__ import annotations

import logging
import os

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

# Imported for the ``turnstile_any`` path convertor it registers (ids may hold slashes).
import engine.remote.inbox_routes  # noqa: F401
from engine.engine import Engine
from engine.remote.auth import Authenticator, InboxPolicy
from engine.remote.cursors import CursorSeal
from engine.remote.ui.assignment_pages import AssignmentForms
from engine.remote.ui.auth_pages import AuthPages
from engine.remote.ui.browser_sessions import InMemoryBrowserSessions
from engine.remote.ui.events import EventStream, live_feeds
from engine.remote.ui.guard import guarded, guarded_json
from engine.remote.ui.history_pages import HistoryPages
from engine.remote.ui.inbox_pages import ApprovalPages, InboxPages
from engine.remote.ui.kit import STATIC, PageKit, UiSettings
from engine.remote.ui.queries import Catalog
from engine.remote.ui.runs_pages import RunsPages
from engine.remote.ui.sessions import SECRET_ENV
from engine.remote.ui.turn_pages import TurnPages

__all__ = ["SECRET_ENV", "InboxUI", "UiSettings"]

logger = logging.getLogger("turnstile.ui")


class StaticPages(StaticFiles):
    """The pages' stylesheet and scripts. A path no file can have (a NUL byte) is simply not
    found: the file system refuses it with ``ValueError``, which would be a 500."""

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if "\x00" in path:
            return "", None
        return super().lookup_path(path)


class InboxUI:
    """The pages of one app: ``InboxUI(engine, ...).routes()`` are mounted by
    :func:`engine.remote.create_app` (``ui=True``, the default)."""

    def __init__(
        self,
        engine: Engine,
        *,
        auth: Authenticator | None,
        policy: InboxPolicy,
        max_body_bytes: int,
        settings: UiSettings | None = None,
        cursors: CursorSeal | None = None,
    ) -> None:
        settings = settings or UiSettings()
        store = settings.session_store
        if store is None:
            store = InMemoryBrowserSessions()
            if auth is not None:
                logger.warning(
                    "no store for browser sessions was given (UiSettings.session_store): "
                    "/ui sessions and sign-in limits live in this process only"
                )
        catalog = Catalog(engine, policy, cursors or CursorSeal(settings.secret))
        self.kit = PageKit(catalog, auth, settings, max_body_bytes, store)
        self.events = EventStream(self.kit, live_feeds(engine))
        if auth is not None and self.kit.cookies.ephemeral:
            logger.warning(
                "no UI secret was given (UiSettings(secret=...); turnstile serve passes %s): "
                "browser sessions of /ui are signed with a key made by this process, so they "
                "end when it restarts and other server processes refuse them",
                SECRET_ENV,
            )

    @property
    def ephemeral_secret(self) -> bool:
        """Whether the cookie secret was made by this process (sessions end with it)."""
        return self.kit.cookies.ephemeral

    def routes(self) -> list[BaseRoute]:
        """The routes under ``/ui`` (those with a suffix first: ids may hold slashes)."""
        kit = self.kit
        inbox, approvals = InboxPages(kit), ApprovalPages(kit)
        assignments = AssignmentForms(kit, approvals)
        turns, history, auth = TurnPages(kit), HistoryPages(kit), AuthPages(kit)
        approval = "/ui/approvals/{approval_id:turnstile_any}"
        turn = "/ui/turns/{turn_id:turnstile_any}"
        return [
            Route("/ui", guarded(kit, inbox.inbox), methods=["GET"]),
            Route("/ui/", self._to_inbox, methods=["GET"]),
            Route("/ui/inbox/live", guarded_json(kit, inbox.live), methods=["GET"]),
            Route("/ui/events", guarded_json(kit, self.events.events), methods=["GET"]),
            Route("/ui/login", auth.login_form, methods=["GET"]),
            Route("/ui/login", auth.login, methods=["POST"]),
            Route("/ui/logout", auth.logout, methods=["POST"]),
            Route("/ui/history", guarded(kit, history.history), methods=["GET"]),
            Route("/ui/history.csv", guarded(kit, history.export), methods=["GET"]),
            Route("/ui/runs", guarded(kit, RunsPages(kit).runs), methods=["GET"]),
            Route(f"{approval}/decision", guarded(kit, approvals.decision), methods=["POST"]),
            Route(f"{approval}/state", guarded_json(kit, approvals.state), methods=["GET"]),
            Route(f"{approval}/claim", guarded(kit, assignments.claim), methods=["POST"]),
            Route(f"{approval}/release", guarded(kit, assignments.release), methods=["POST"]),
            Route(f"{approval}/assign", guarded(kit, assignments.assign), methods=["POST"]),
            Route(approval, guarded(kit, approvals.show), methods=["GET"]),
            Route(f"{turn}/abort", guarded(kit, turns.abort), methods=["POST"]),
            Route(f"{turn}/retry", guarded(kit, turns.retry), methods=["POST"]),
            Route(f"{turn}/state", guarded_json(kit, turns.state), methods=["GET"]),
            Route(turn, guarded(kit, turns.show), methods=["GET"]),
            Mount("/ui/static", StaticPages(directory=STATIC), name="ui-static"),
        ]

    async def _to_inbox(self, request: Request) -> Response:
        return self.kit.redirect(request, None, "/ui")
