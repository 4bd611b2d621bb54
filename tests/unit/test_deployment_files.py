"""What the Dockerfile, .dockerignore and compose.yaml must agree on with the package, checked
without Docker: each test names a way the image or the compose file would break while still
building or parsing. ``tests/acceptance/test_deployment.py`` runs the compose services.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy.engine import make_url

from tests.deployment_support import (
    DOCKERFILE,
    DOCKERIGNORE,
    ROOT,
    Instruction,
    command_option,
    dockerfile_instructions,
    duration_seconds,
    environment_of,
    exec_form,
    healthcheck_command,
    ignore_rules,
    in_build_context,
    last,
    load_compose,
    stages,
)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: compose.yaml's database service (a module constant: tests/databases.py marks a test whose
#: own code names "postgres" as one that opens a database).
DATABASE_SERVICE = "postgres"
#: A stand-in for the key an operator exports before ``docker compose up``.
VARIABLES = {"TURNSTILE_STATE_KEYS": "unit-test:not-used-to-sign"}


def image_stages() -> tuple[list[Instruction], list[Instruction]]:
    """The Dockerfile's build stage and final stage."""
    found = stages(dockerfile_instructions(DOCKERFILE.read_text()))
    assert len(found) == 2, "expected a build stage and a final stage"
    return found[0], found[1]


def base_image(stage: list[Instruction]) -> str:
    return stage[0].arguments.split()[0]


def test_the_venv_built_in_one_stage_runs_on_the_same_python_in_the_other() -> None:
    """The final stage copies the build stage's virtual environment, whose interpreter links
    are only valid on the same Python; both are the slim Python 3.11 image."""
    build, final = image_stages()
    assert base_image(final) == "python:3.11-slim"
    assert base_image(build) == base_image(final)
    requires = PYPROJECT["project"]["requires-python"]
    assert requires == ">=3.11", f"update the base image together with requires-python {requires}"


def test_the_entrypoint_is_the_installed_console_script_on_path() -> None:
    """``ENTRYPOINT ["turnstile"]`` resolves to the script ``pip install`` wrote into the
    virtual environment that the final stage copies and puts first on PATH."""
    build, final = image_stages()
    created = [i.arguments for i in build if i.keyword == "RUN" and "-m venv" in i.arguments]
    assert len(created) == 1, "the build stage creates one virtual environment"
    venv = created[0].split()[-1]
    installs = [i.arguments for i in build if i.keyword == "RUN" and "pip install" in i.arguments]
    assert installs and all(a.startswith(f"{venv}/bin/pip install") for a in installs)

    build_name = build[0].arguments.split()[-1]
    copies = [i.arguments.split() for i in final if i.keyword == "COPY"]
    assert [f"--from={build_name}", venv, venv] in copies
    path = next(i.arguments for i in final if i.keyword == "ENV" and "PATH=" in i.arguments)
    assert re.search(rf"PATH={re.escape(venv)}/bin:\$PATH", path), path

    entrypoint = exec_form(last(final, "ENTRYPOINT").arguments)
    assert entrypoint == ["turnstile"]
    assert entrypoint[0] in PYPROJECT["project"]["scripts"]


def test_the_package_is_installed_from_the_copied_source_with_known_extras() -> None:
    """pip installs the repository copied into the build stage; a misspelt extra would only
    be a pip warning, and the model SDK would be missing at run time."""
    build, _final = image_stages()
    copy = next(i.arguments.split() for i in build if i.keyword == "COPY")
    assert copy[0] == ".", "the build copies the context (narrowed by .dockerignore)"
    source = copy[1]
    install = next(
        i.arguments for i in build if i.keyword == "RUN" and "pip install" in i.arguments
    )
    # The extras in brackets only when there are any: pip reads "/src[]" as a missing path.
    assert f'"{source}${{EXTRAS:+[$EXTRAS]}}"' in install, install
    extras_arg = next(i.arguments for i in build if i.keyword == "ARG" and "EXTRAS=" in i.arguments)
    extras = [extra for extra in extras_arg.partition("=")[2].split(",") if extra]
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"]), extras


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    """Kubernetes' ``runAsNonRoot`` can verify only a numeric user; root may not be it."""
    _build, final = image_stages()
    user = last(final, "USER").arguments
    uid = user.partition(":")[0]
    assert uid.isdigit(), f"USER {user} is not numeric"
    assert int(uid) != 0
    created = [i.arguments for i in final if i.keyword == "RUN" and "useradd" in i.arguments]
    assert len(created) == 1 and f"--uid {uid} " in created[0], "USER names the created user"
    workdir = last(final, "WORKDIR").arguments
    assert f"chown turnstile:turnstile {workdir}" in created[0], (
        "the working directory (the default SQLite folder) must be writable by the user"
    )


def test_the_image_healthcheck_probes_liveness_on_an_exposed_port() -> None:
    """Without ``HEALTHCHECK_URL`` the probe asks ``/healthz`` on a port the image exposes."""
    _build, final = image_stages()
    probe = healthcheck_command(last(final, "HEALTHCHECK"))
    assert probe[:2] == ["python", "-c"]
    defaults = re.findall(r"'HEALTHCHECK_URL', '([^']+)'", probe[2])
    assert len(defaults) == 1, probe[2]
    default = urlsplit(defaults[0])
    assert default.path == "/healthz"
    exposed = last(final, "EXPOSE").arguments.split()
    assert str(default.port) in exposed


def package_files() -> list[str]:
    """Every file ``pip install .`` reads: pyproject.toml, the readme it names, and the
    packages its ``packages.find`` includes."""
    project = PYPROJECT["project"]
    needed = ["pyproject.toml", project["readme"]]
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {
        path
        for pattern in patterns
        for path in ROOT.glob(pattern.split(".")[0])
        if path.is_dir() and not path.name.startswith(".")
    }
    for top in sorted(tops):
        needed += [
            str(path.relative_to(ROOT))
            for path in top.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        ]
    return needed


def test_the_build_context_holds_the_package_and_nothing_else() -> None:
    """``COPY . /src`` sends what .dockerignore lets through: every file the package needs
    (a missing readme fails the build, a missing module the image), and none of the local
    state — the virtual environment, .git, SQLite files, tests."""
    rules = ignore_rules(DOCKERIGNORE.read_text())
    needed = package_files()
    assert any(path.startswith("migrations/versions/") for path in needed)
    missing = [path for path in needed if not in_build_context(path, rules)]
    assert not missing, f"left out of the build context: {missing}"

    needed_tops = {path.split("/")[0] for path in needed}
    local = [
        path.name
        for path in ROOT.iterdir()
        if path.name not in needed_tops and path.name not in {"Dockerfile", ".dockerignore"}
    ]
    unwanted = [*local, ".venv/bin/python", ".git/HEAD", ".turnstile/turnstile.db"]
    unwanted += ["tests/conftest.py", "engine/__pycache__/engine.cpython-311.pyc"]
    for path in unwanted:
        assert not in_build_context(path, rules), path


def compose(variables: dict[str, str] | None = None) -> dict[str, Any]:
    return load_compose(VARIABLES if variables is None else variables)


def test_compose_reads_without_a_state_key_and_hands_the_app_an_empty_one() -> None:
    """Without ``TURNSTILE_STATE_KEYS`` the file still loads, so ``docker compose ps``,
    ``logs`` and ``down`` work; the app services get it empty, which ``worker`` and ``serve``
    refuse at start, naming it (tests/acceptance/test_deployment.py runs that refusal)."""
    services = compose({})["services"]
    for name in ("worker", "serve"):
        assert environment_of(services[name])["TURNSTILE_STATE_KEYS"] == ""


def test_compose_builds_the_image_once() -> None:
    """Only the first Turnstile service builds the image; the others run it as built and
    never try to pull it from a registry."""
    services = compose()["services"]
    turnstile = [n for n, s in services.items() if s.get("image") == "turnstile:latest"]
    assert [n for n in turnstile if "build" in services[n]] == ["migrate"]
    assert all(services[n].get("pull_policy") == "never" for n in turnstile)


def test_every_database_url_reaches_the_postgres_service_as_its_user() -> None:
    """Host, user, password and database of each service's URL are the postgres service's
    own, with the default password and with one an operator sets."""
    for password in (None, "s3cret-from-env"):
        variables = dict(VARIABLES, **({"POSTGRES_PASSWORD": password} if password else {}))
        services = compose(variables)["services"]
        postgres = environment_of(services[DATABASE_SERVICE])
        for name, definition in services.items():
            if name == DATABASE_SERVICE:
                continue
            url = make_url(environment_of(definition)["TURNSTILE_DATABASE_URL"])
            assert url.host == DATABASE_SERVICE and url.port == 5432, name
            assert url.username == postgres["POSTGRES_USER"], name
            assert url.password == postgres["POSTGRES_PASSWORD"], name
            assert url.database == postgres["POSTGRES_DB"], name
            if password:
                assert url.password == password


def test_a_stopping_worker_gets_its_shutdown_grace_before_it_is_killed() -> None:
    """``docker compose stop`` kills after ``stop_grace_period``: it must exceed the worker's
    ``--shutdown-grace``, or running turns are cut off instead of handed back."""
    worker = compose()["services"]["worker"]
    grace = command_option([str(a) for a in worker["command"]], "--shutdown-grace")
    assert grace is not None, "the worker names its --shutdown-grace"
    assert duration_seconds(worker["stop_grace_period"]) > float(grace)


def test_app_services_report_ready_and_listen_beyond_loopback() -> None:
    """The worker and the server are healthy when ready (``/readyz`` on the port they listen
    on), and listen on every interface so that the published port and scrapes reach them."""
    services = compose()["services"]
    for name, port_flag, host_flag in (
        ("worker", "--health-port", "--health-host"),
        ("serve", "--port", "--host"),
    ):
        command = [str(a) for a in services[name]["command"]]
        probe = urlsplit(environment_of(services[name])["HEALTHCHECK_URL"])
        assert probe.path == "/readyz", name
        assert str(probe.port) == command_option(command, port_flag), name
        assert command_option(command, host_flag) == "0.0.0.0", name


def test_duration_parsing() -> None:
    """The Compose durations the tests read."""
    assert duration_seconds("30s") == 30
    assert duration_seconds("1m30s") == 90
    assert duration_seconds("500ms") == 0.5
    with pytest.raises(ValueError):
        duration_seconds("30")


def test_dockerignore_rules_follow_docker() -> None:
    """Last match wins, a directory's rule covers its files, ``**`` spans directories."""
    rules = ignore_rules("*\n!engine\n**/__pycache__\n")
    assert in_build_context("engine/models/config.py", rules)
    assert not in_build_context("engine/models/__pycache__/config.cpython-311.pyc", rules)
    assert not in_build_context("tests/unit/test_cli.py", rules)
    assert not in_build_context("README.md", rules)
    assert in_build_context("README.md", ignore_rules(""))
