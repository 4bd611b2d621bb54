"""Reading the deployment files as Docker and Docker Compose read them, for the tests.

The parts of each format the repository's files use, and no more: a Dockerfile's instructions
(line continuations, comments, exec-form JSON), ``.dockerignore`` rules (last match wins, a
directory's rule covers what it holds, ``!`` re-includes), and Compose's variable
interpolation (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
``${VAR?error}``, ``$$``) and durations (``30s``, ``1m30s``, ``500ms``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_FILE = ROOT / "compose.yaml"


class InterpolationError(ValueError):
    """A required Compose variable (``${VAR:?message}``) is unset, as ``docker compose`` says."""


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case) and the text after it."""

    keyword: str
    arguments: str


def dockerfile_instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined, comments left out."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction is dropped, as Docker does
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued line")
    return instructions


def stages(instructions: Iterable[Instruction]) -> list[list[Instruction]]:
    """The build stages: each a list starting with its ``FROM``."""
    found: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            found.append([instruction])
        elif found:
            found[-1].append(instruction)
    return found


def exec_form(arguments: str) -> list[str]:
    """An instruction's exec form (a JSON array of strings); ``ValueError`` for shell form."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not exec form (a JSON array): {arguments!r}") from exc
    if not isinstance(parsed, list) or not all(isinstance(part, str) for part in parsed):
        raise ValueError(f"not exec form (a JSON array of strings): {arguments!r}")
    return parsed


_HEALTHCHECK_CMD = re.compile(r"(?:^|\s+)CMD\s+")


def healthcheck_command(instruction: Instruction) -> list[str]:
    """The command of a ``HEALTHCHECK [--option=value ...] CMD [...]`` instruction."""
    options, command = _HEALTHCHECK_CMD.split(instruction.arguments, maxsplit=1)
    if not all(option.startswith("--") for option in options.split()):
        raise ValueError(f"unexpected HEALTHCHECK options: {options!r}")
    return exec_form(command)


def last(stage: Iterable[Instruction], keyword: str) -> Instruction:
    """The last instruction of ``keyword`` in a stage (the one in effect)."""
    matching = [instruction for instruction in stage if instruction.keyword == keyword]
    if not matching:
        raise AssertionError(f"no {keyword} instruction")
    return matching[-1]


# --- .dockerignore ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    """One ``.dockerignore`` line: the pattern as a regular expression, and whether it is an
    exception (``!``) that puts matching paths back into the build context."""

    pattern: re.Pattern[str]
    include: bool


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A Docker path pattern as a regex: ``*`` and ``?`` stay within one path segment,
    ``**`` spans any number of them."""
    out: list[str] = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(out))


def ignore_rules(text: str) -> list[IgnoreRule]:
    """The rules of a ``.dockerignore`` file, in order."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        cleaned = line.lstrip("!").strip().strip("/")
        rules.append(IgnoreRule(_pattern_regex(cleaned), include))
    return rules


def in_build_context(path: str, rules: Iterable[IgnoreRule]) -> bool:
    """Whether the file at ``path`` (relative, ``/``-separated) is sent to the builder: the
    last rule matching it or one of its parent directories decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: depth + 1]) for depth in range(len(parts))]
    included = True
    for rule in rules:
        if any(rule.pattern.fullmatch(candidate) for candidate in candidates):
            included = rule.include
    return included


# --- Compose ---------------------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<operator>:?[-?])(?P<argument>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """``text`` with Compose's ``$`` substitutions made from ``variables``."""

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        value = variables.get(name)
        operator, argument = match["operator"], match["argument"] or ""
        missing = value is None or (operator is not None and operator.startswith(":") and not value)
        if operator in ("-", ":-") and missing:
            return argument
        if operator in ("?", ":?") and missing:
            raise InterpolationError(f"required variable {name} is missing a value: {argument}")
        return value or ""

    return _VARIABLE.sub(substitute, text)


def _interpolate_all(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [_interpolate_all(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_all(value, variables) for key, value in node.items()}
    return node


def load_compose(variables: Mapping[str, str], path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The Compose file with its variables substituted (YAML anchors and merge keys resolved
    by the YAML loader)."""
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a mapping")
    result: dict[str, Any] = _interpolate_all(loaded, variables)
    return result


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}


def duration_seconds(text: str) -> float:
    """A Compose duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a Compose duration: {text!r}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def command_option(command: list[str], flag: str) -> str | None:
    """The value following ``flag`` in an argument list (``--flag value``), or ``None``."""
    for index, argument in enumerate(command[:-1]):
        if argument == flag:
            return command[index + 1]
    return None


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` as a mapping. A variable listed without a value would be
    taken from the shell running Compose; the tests' shell has none, so it is left unset."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        pairs = [item.partition("=") for item in environment]
        return {key: value for key, sep, value in pairs if sep}
    return {key: str(value) for key, value in environment.items() if value is not None}
