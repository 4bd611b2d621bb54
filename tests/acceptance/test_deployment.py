"""compose.yaml, run as written but without Docker: each Turnstile service's command is a real
``turnstile`` process, started in the order and under the conditions of its ``depends_on``.

What stands in for a container: the Dockerfile's ``ENTRYPOINT`` is resolved in this virtual
environment (where ``pip install`` put the same console script), a process starts in an empty
working directory with only the service's environment, the PostgreSQL service is a fresh
database of the test server (emptied, so the ``migrate`` service does real work), and the
ports a service listens on are mapped to free ones as a container's ports would be. The
healthchecks are the ones Docker would run — the compose ``healthcheck.test``, else the
Dockerfile's ``HEALTHCHECK`` — run as processes too. Building the image needs a Docker daemon,
which the test machines do not have; ``tests/unit/test_deployment_files.py`` checks what the
build reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command as alembic_command
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from engine.state.signing import StateSigner
from stores.migrate import _config, current_revision, head_revision
from tests.databases import postgres_url
from tests.deployment_support import (
    DOCKERFILE,
    command_option,
    dockerfile_instructions,
    duration_seconds,
    environment_of,
    exec_form,
    healthcheck_command,
    last,
    load_compose,
    stages,
)
from tests.http_support import free_port

pytestmark = pytest.mark.timeout(180)

#: The service keys this runner follows or may ignore. Any other (``entrypoint``,
#: ``working_dir``, ``env_file``, ``user``, ...) would change what runs, so it fails the test
#: until the runner learns it.
FOLLOWED_KEYS = frozenset(
    {"build", "image", "command", "environment", "depends_on", "healthcheck", "stop_grace_period"}
)
#: Container-level settings with no process to follow: publishing ports (the runner maps every
#: listening port), PID 1's init, restart policies, where the image comes from.
CONTAINER_KEYS = frozenset({"ports", "init", "restart", "pull_policy"})
PORT_FLAGS = ("--port", "--health-port")
HOST_FLAGS = ("--host", "--health-host")
#: How long a service may take to become healthy or to finish (a generous bound on a busy CI).
START_TIMEOUT = 60.0
TRANSFER = "Transfer $500 to my savings account"
STATE_KEY_ID = "deploy-test"


def venv_executable(name: str) -> str:
    """A program of this virtual environment: what the image's PATH finds first."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed in {path.parent} (pip install -e .)"
    return str(path)


@dataclass
class Service:
    """One compose service turned into a process: its argv, environment and mapped ports."""

    name: str
    definition: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)
    healthcheck: list[str] | None = None
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def url(self, container_port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[container_port]}{path}"

    def output(self) -> str:
        """The process's output so far (for failure messages)."""
        return self.log.read_text(errors="replace")[-4000:] if self.log else ""

    def healthy(self) -> bool:
        """Whether the service's healthcheck passes now (exit 0), as Docker decides."""
        assert self.healthcheck is not None, f"{self.name} has no healthcheck"
        probe = subprocess.run(self.healthcheck, env=self.env, capture_output=True, timeout=30)
        return probe.returncode == 0


def _map_ports(container: str, ports: dict[str, int]) -> str:
    """``container`` (a URL or an argument) with each mapped loopback port replaced."""
    for inside, outside in ports.items():
        for host in ("127.0.0.1", "localhost"):
            container = container.replace(f"{host}:{inside}", f"127.0.0.1:{outside}")
    return container


def build_service(
    name: str,
    definition: dict[str, Any],
    *,
    entrypoint: list[str],
    image_healthcheck: list[str],
    database_url: str,
    workdir: Path,
) -> Service:
    """The process standing in for service ``name``'s container."""
    unknown = set(definition) - FOLLOWED_KEYS - CONTAINER_KEYS
    assert not unknown, f"service {name} uses {sorted(unknown)}, which this test does not follow"
    command = [str(part) for part in definition.get("command", [])]
    ports: dict[str, int] = {}
    for flag in PORT_FLAGS:
        port = command_option(command, flag)
        if port is not None:
            ports[port] = free_port()
            command[command.index(flag) + 1] = str(ports[port])
    for flag in HOST_FLAGS:
        if command_option(command, flag) is not None:
            # The processes share this machine's network, not a container's of their own.
            command[command.index(flag) + 1] = "127.0.0.1"
    declared = environment_of(definition)
    composed_url = declared.get("TURNSTILE_DATABASE_URL")
    assert composed_url, f"service {name} sets no TURNSTILE_DATABASE_URL"
    # The test database, reached under the scheme compose.yaml writes.
    test_url = make_url(database_url).set(drivername=make_url(composed_url).drivername)
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}",
        "HOME": str(workdir),
        **{key: _map_ports(value, ports) for key, value in declared.items()},
        "TURNSTILE_DATABASE_URL": test_url.render_as_string(hide_password=False),
    }
    healthcheck = _healthcheck(definition.get("healthcheck") or {}, image_healthcheck)
    return Service(
        name=name,
        definition=definition,
        argv=[venv_executable(entrypoint[0]), *entrypoint[1:], *command],
        env=env,
        ports=ports,
        healthcheck=None if healthcheck is None else [_map_ports(a, ports) for a in healthcheck],
    )


def _healthcheck(compose: Mapping[str, Any], image: list[str]) -> list[str] | None:
    """The command Docker would probe with: compose's ``test``, else the image's."""
    if compose.get("disable"):
        return None
    test = compose.get("test")
    if test is None:
        return [venv_executable(image[0]), *image[1:]]
    assert isinstance(test, list) and test[0] == "CMD", f"unexpected healthcheck test {test!r}"
    return [venv_executable(test[1]), *test[2:]]


def start_order(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The services in an order that starts every dependency first (file order otherwise)."""
    ordered: list[str] = []
    while len(ordered) < len(services):
        ready = [
            name
            for name, definition in services.items()
            if name not in ordered and set(definition.get("depends_on") or {}) <= set(ordered)
        ]
        assert ready, f"depends_on has a cycle among {sorted(set(services) - set(ordered))}"
        ordered.append(ready[0])
    return ordered


def wait_for(
    check: Callable[[], bool], *, what: str, service: Service, timeout: float = START_TIMEOUT
) -> None:
    """Poll ``check`` until it holds; fail early when the service's process died."""
    deadline = time.monotonic() + timeout
    while not check():
        if service.process is not None and service.process.poll() not in (None, 0):
            raise AssertionError(
                f"{service.name} exited with {service.process.returncode} while waiting for "
                f"{what}:\n{service.output()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{service.output()}")
        time.sleep(0.2)


def satisfy(condition: str, dependency: Service) -> None:
    """Wait until ``dependency`` meets a ``depends_on`` condition, as Compose does."""
    if condition == "service_completed_successfully":
        assert dependency.process is not None
        try:
            status = dependency.process.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{dependency.name} did not finish") from None
        assert status == 0, f"{dependency.name} exited with {status}:\n{dependency.output()}"
    elif condition == "service_healthy":
        wait_for(dependency.healthy, what=f"{dependency.name} healthy", service=dependency)
    else:
        assert condition == "service_started", f"unknown depends_on condition {condition!r}"


def start(service: Service, workdir: Path) -> None:
    service.log = workdir / f"{service.name}.log"
    with service.log.open("wb") as log:
        service.process = subprocess.Popen(
            service.argv, cwd=workdir, env=service.env, stdout=log, stderr=subprocess.STDOUT
        )


def stop(service: Service) -> int:
    """``docker compose stop``: SIGTERM, then SIGKILL after the service's stop grace period."""
    assert service.process is not None
    grace = duration_seconds(service.definition.get("stop_grace_period", "10s"))
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
    try:
        return service.process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()
        raise AssertionError(
            f"{service.name} outlived its stop_grace_period of {grace:g}s:\n{service.output()}"
        ) from None


@contextlib.contextmanager
def compose_up(
    compose: Mapping[str, Any], database_url: str, workdir: Path
) -> Iterator[dict[str, Service]]:
    """Start the services built from the Dockerfile, dependencies first; yields them by name
    and stops the ones still running at the end."""
    final = stages(dockerfile_instructions(DOCKERFILE.read_text()))[-1]
    entrypoint = exec_form(last(final, "ENTRYPOINT").arguments)
    image_healthcheck = healthcheck_command(last(final, "HEALTHCHECK"))
    definitions: dict[str, Any] = compose["services"]
    # The services built from the Dockerfile, and those running the image one of them builds.
    built = {d.get("image") for d in definitions.values() if d.get("build") == "."}
    ours = {
        name: d
        for name, d in definitions.items()
        if d.get("build") == "." or (d.get("image") in built and d.get("image") is not None)
    }
    running: dict[str, Service] = {}
    try:
        for name in start_order(definitions):
            if name not in ours:
                # Stands in for the PostgreSQL service: the test server is up and healthy.
                continue
            service = build_service(
                name,
                ours[name],
                entrypoint=entrypoint,
                image_healthcheck=image_healthcheck,
                database_url=database_url,
                workdir=workdir,
            )
            for dependency, rule in (ours[name].get("depends_on") or {}).items():
                if dependency in ours:
                    satisfy(rule["condition"], running[dependency])
                else:
                    assert rule["condition"] == "service_healthy", (name, dependency, rule)
            start(service, workdir)
            running[name] = service
        yield running
    finally:
        for service in running.values():
            if service.process is not None and service.process.poll() is None:
                service.process.kill()
                service.process.wait()


def scrape(url: str) -> dict[str, float]:
    """Unlabelled samples of a ``/metrics`` page, by name."""
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if not sample.labels
    }


def turn_body(text: str) -> dict[str, Any]:
    return {"data": {"message": {"role": "user", "content": [{"text": text}]}}, "init": {}}


def test_compose_services_run_as_written(tmp_path: Path) -> None:
    """migrate → worker → serve from compose.yaml, on an empty database: migrate brings it to
    head and exits 0; the worker and the server pass their healthchecks and answer /healthz and
    /readyz; a turn sent to serve is run by the worker; the client-managed agent signs with
    the key compose passes; on SIGTERM both stop in their grace period with status 0."""
    secret = secrets.token_urlsafe(32)
    compose = load_compose({"TURNSTILE_STATE_KEYS": f"{STATE_KEY_ID}:{secret}"})
    with postgres_url() as url:
        alembic_command.downgrade(_config(url), "base")  # what the postgres service starts with
        assert current_revision(url) is None

        with compose_up(compose, url, tmp_path) as services:
            assert list(services) == ["migrate", "worker", "serve"]
            worker, serve = services["worker"], services["serve"]
            for service in (worker, serve):
                wait_for(service.healthy, what=f"{service.name} healthy", service=service)
            assert current_revision(url) == head_revision()
            assert "database at head" in services["migrate"].output()

            _check_probes(serve.url("8080", ""), worker="none")
            _check_probes(worker.url("9090", ""), worker="running")
            _check_a_queued_turn(serve.url("8080", ""), worker.url("9090", "/metrics"))
            _check_client_managed_state(serve.url("8080", ""), {STATE_KEY_ID: secret})

            for service in (worker, serve):
                status = stop(service)
                assert status == 0, (
                    f"{service.name} exited with {status} after SIGTERM, not 0 as for a clean "
                    f"stop (docs/configuration.md):\n{service.output()}"
                )
                # The same probe now fails: it is not a check that always passes.
                assert not service.healthy()


def _check_probes(base: str, *, worker: str) -> None:
    """/healthz and /readyz answer 200; readiness names the database at head (and, on the
    worker, a running pool)."""
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    ready = httpx.get(f"{base}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["database"] == f"at head {head_revision()}"
    if worker == "running":
        assert checks["workers"].startswith("running"), checks
    else:
        assert "workers" not in checks, checks


def _check_a_queued_turn(base: str, worker_metrics: str) -> None:
    """serve runs no pool, so the worker process claims the turn; it pauses for approval."""
    paused = httpx.post(f"{base}/api/bankingAgent", json=turn_body(TRANSFER), timeout=60)
    assert paused.status_code == 200, paused.text
    result = paused.json()["result"]
    assert result["finishReason"] == "interrupted", result
    assert scrape(worker_metrics)["turnstile_worker_turns_claimed_total"] == 1


def _check_client_managed_state(base: str, keys: dict[str, str | bytes]) -> None:
    """The stateless agent's state comes back signed with the key compose passes."""
    paused = httpx.post(f"{base}/api/bankingAgentStateless", json=turn_body(TRANSFER), timeout=60)
    assert paused.status_code == 200, paused.text
    result = paused.json()["result"]
    assert result["finishReason"] == "interrupted", result
    assert result["state"]["signature"].split(".")[1] == STATE_KEY_ID
    StateSigner(keys).verify(result["state"], agent="bankingAgentStateless")
