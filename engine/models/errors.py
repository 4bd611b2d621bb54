"""How provider failures become Turnstile errors.

A model call fails in one of two ways that matter to the engine:

* **transient** — rate limits, timeouts, lost connections, 5xx and overload: the same request
  may well succeed later, so the adapter raises :class:`~engine.model.TransientModelError` and
  the executor retries the turn with backoff (up to the agent's ``max_attempts``);
* **permanent** — bad credentials, a request the provider refuses, content policy: retrying
  cannot help, so the adapter raises a :class:`ModelError` carrying a Genkit status and the
  provider's own message, and the turn fails with it.

Both adapters describe a failure as a :class:`ProviderFailure` (what the HTTP status, the error
body and the exception type say) and let :func:`classify` decide, so the two providers follow
one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import AgentError
from engine.model import TransientModelError

__all__ = [
    "ModelAuthenticationError",
    "ModelContentPolicyError",
    "ModelError",
    "ModelNotFoundError",
    "ModelPermissionError",
    "ModelRequestError",
    "ProviderFailure",
    "classify",
    "provider_message",
]


class ModelError(AgentError):
    """A permanent failure of a model provider; ``details`` names the provider and status."""

    default_status = "INTERNAL"


class ModelAuthenticationError(ModelError):
    """The provider rejected the credentials (HTTP 401): fix the API key."""

    default_status = "UNAUTHENTICATED"


class ModelPermissionError(ModelError):
    """The credentials are valid but not allowed to use this model or endpoint (HTTP 403)."""

    default_status = "PERMISSION_DENIED"


class ModelNotFoundError(ModelError):
    """The model (or the endpoint) does not exist at this provider (HTTP 404)."""

    default_status = "NOT_FOUND"


class ModelRequestError(ModelError):
    """The provider refused the request as invalid (HTTP 400/413/422)."""

    default_status = "INVALID_ARGUMENT"


class ModelContentPolicyError(ModelError):
    """The provider refused the content under its usage policy.

    ``FAILED_PRECONDITION``, as Genkit's ``GenerationBlockedError``: the request is well-formed
    but cannot be served as it stands; a different message may succeed.
    """

    default_status = "FAILED_PRECONDITION"


# Error types / codes the providers use for conditions that pass with time.
_TRANSIENT_TYPES = frozenset(
    {
        "rate_limit_error",
        "rate_limit_exceeded",
        "overloaded_error",
        "api_error",
        "server_error",
        "timeout_error",
        "service_unavailable",
        "insufficient_quota_temporary",
    }
)
# Markers of a content-policy refusal: OpenAI's code, Azure OpenAI's content filter.
_POLICY_CODES = frozenset({"content_policy_violation", "content_filter"})
_POLICY_WORDS = ("content policy", "content filter", "content management policy", "usage policy")


@dataclass(frozen=True)
class ProviderFailure:
    """What is known about one failed call, independent of the SDK that reported it."""

    provider: str
    message: str
    http_status: int | None = None
    error_type: str | None = None
    code: str | None = None
    connection: bool = False
    timeout: bool = False

    def details(self) -> dict[str, Any]:
        """The ``details`` recorded with the turn's error (operators filter on them in SQL)."""
        found: dict[str, Any] = {"provider": self.provider}
        if self.http_status is not None:
            found["httpStatus"] = self.http_status
        if self.error_type:
            found["type"] = self.error_type
        if self.code:
            found["code"] = self.code
        return found


def provider_message(body: object, fallback: str) -> tuple[str, str | None, str | None]:
    """``(message, type, code)`` from an error body shaped ``{"error": {...}}`` or ``{...}``.

    Both providers wrap the error object in ``{"error": ...}`` (OpenAI's SDK hands over the
    inner object already); ``type`` and ``code`` are ``None`` when absent.
    """
    inner = body
    if isinstance(inner, dict) and isinstance(inner.get("error"), dict):
        inner = inner["error"]
    if not isinstance(inner, dict):
        return fallback, None, None
    message = inner.get("message")
    kind = inner.get("type")
    code = inner.get("code")
    return (
        str(message) if message else fallback,
        str(kind) if kind else None,
        str(code) if code else None,
    )


def _is_policy(failure: ProviderFailure) -> bool:
    if failure.code in _POLICY_CODES or failure.error_type in _POLICY_CODES:
        return True
    lowered = failure.message.lower()
    return any(word in lowered for word in _POLICY_WORDS)


def classify(failure: ProviderFailure) -> Exception:
    """The exception to raise for ``failure``: transient or a permanent :class:`ModelError`."""
    status = failure.http_status
    label = failure.provider
    if failure.timeout:
        return TransientModelError(f"{label} request timed out: {failure.message}")
    if failure.connection:
        return TransientModelError(f"{label} connection failed: {failure.message}")
    if status is not None and (status in (408, 409, 429) or status >= 500):
        return TransientModelError(f"{label} error (HTTP {status}): {failure.message}")
    if failure.error_type in _TRANSIENT_TYPES and status in (None, 200):
        # An error event inside a stream that had already started with 200 OK.
        return TransientModelError(f"{label} error ({failure.error_type}): {failure.message}")
    details = failure.details()
    text = f"{label} rejected the request"
    if status is not None and status != 200:
        text += f" (HTTP {status})"
    text += f": {failure.message}"
    if _is_policy(failure):
        return ModelContentPolicyError(text, details=details)
    if status == 401:
        return ModelAuthenticationError(text, details=details)
    if status == 403:
        return ModelPermissionError(text, details=details)
    if status == 404:
        return ModelNotFoundError(text, details=details)
    return ModelRequestError(text, details=details)
