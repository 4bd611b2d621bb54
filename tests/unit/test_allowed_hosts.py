"""Which ``Host`` header values an allowed-hosts list accepts (engine.remote.hosts)."""

from __future__ import annotations

import pytest

from engine.remote.hosts import LOCAL_HOSTS, host_allowed


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST.:80"]
)
def test_local_names_are_allowed_with_or_without_a_port(host: str) -> None:
    """A local name is accepted whatever its port, case or trailing dot."""
    assert host_allowed(host, LOCAL_HOSTS)


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io:8000", "", "[::1"],
)
def test_other_names_are_refused_by_the_local_list(host: str) -> None:
    """A name that merely starts like a local one, an empty Host, or a broken literal is refused."""
    assert not host_allowed(host, LOCAL_HOSTS)


def test_a_wildcard_matches_subdomains_only() -> None:
    """``*.example.com`` matches a subdomain, not the bare domain nor a look-alike suffix."""
    allowed = ["*.example.com"]
    assert host_allowed("approvals.example.com:443", allowed)
    assert not host_allowed("example.com", allowed)
    assert not host_allowed("badexample.com", allowed)


def test_a_star_allows_any_host() -> None:
    """``*`` is the explicit opt-out, for a server behind a proxy that checks names itself."""
    assert host_allowed("anything.example", ["*"])
