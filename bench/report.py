"""Results of ``bench/approvals.py`` and the tables it prints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.common import Sample, ServerStats, fmt, percentile, render_table

__all__ = [
    "EMBEDDED",
    "FLOORS",
    "IMPLS",
    "OURS",
    "PEERS",
    "SETTLE_ONLY",
    "Latencies",
    "Result",
    "is_floor",
    "is_ours",
    "is_peer",
    "report",
]

#: Turnstile with a worker pool in the clients' own process (and P - 1 worker processes).
EMBEDDED = "turnstile-embedded"
#: The product's configurations: every worker in a process of its own, or one pool embedded
#: in the clients' process. Each is compared with the floors and the peers on its own.
OURS = ("turnstile", EMBEDDED)

#: The floor without the transfer round's checkpoints (see ``bench/floor.py``).
SETTLE_ONLY = "floor-settle-only"
#: The floors: with the round checkpoints the product's guarantees need (the target's), and
#: without them (earlier rounds' floor, for comparison).
FLOORS = ("floor", SETTLE_ONLY)
#: The peers: LangGraph with its sync saver and threads, and with its async saver and tasks
#: (``bench/langgraph_peer.py``; optional dependencies, ``pip install -e '.[bench]'``).
PEERS = ("langgraph", "langgraph-async")
IMPLS = (*OURS, *FLOORS, *PEERS)


def is_ours(impl: str) -> bool:
    """Whether ``impl`` names one of the product's configurations (:data:`OURS`)."""
    return impl in OURS


def is_floor(impl: str) -> bool:
    """Whether ``impl`` names one of the floors (not the product)."""
    return impl in FLOORS


def is_peer(impl: str) -> bool:
    """Whether ``impl`` names another system doing the same work (not ours)."""
    return impl in PEERS


@dataclass
class Latencies:
    """Milliseconds from each resume call's start to the resumed turn's pickup (its claim
    logged by the worker), to its ``settled_at``, and to the resume call's return; and from
    the resumed turn's ``created_at`` to its pickup (the wake-up path alone)."""

    pickup_ms: list[float] = field(default_factory=list)
    created_pickup_ms: list[float] = field(default_factory=list)
    settled_ms: list[float] = field(default_factory=list)
    returned_ms: list[float] = field(default_factory=list)
    missing_pickups: int = 0

    @classmethod
    def of(
        cls,
        samples: list[Sample],
        claims: dict[str, float],
        created: dict[str, float],
        settled: dict[str, float],
    ) -> Latencies:
        """Join the samples with the claim, ``created_at`` and ``settled_at`` times (unix s)."""

        def since(times: dict[str, float]) -> list[float]:
            return [
                (times[s.resumed_turn] - s.resume_at) * 1e3
                for s in samples
                if s.resumed_turn in times
            ]

        return cls(
            pickup_ms=since(claims),
            created_pickup_ms=[
                (claims[s.resumed_turn] - created[s.resumed_turn]) * 1e3
                for s in samples
                if s.resumed_turn in claims and s.resumed_turn in created
            ],
            settled_ms=since(settled),
            returned_ms=[(s.done_at - s.resume_at) * 1e3 for s in samples],
            missing_pickups=sum(1 for s in samples if s.resumed_turn not in claims),
        )

    def cells(self) -> list[str]:
        """p50 and p95 of pickup, created->pickup, settled and returned."""
        out = []
        for values, digits in (
            (self.pickup_ms, 2),
            (self.created_pickup_ms, 2),
            (self.settled_ms, 1),
            (self.returned_ms, 1),
        ):
            out += [fmt(percentile(values, 50), digits), fmt(percentile(values, 95), digits)]
        return out


@dataclass
class Result:
    """One implementation (``turnstile``, ``turnstile-embedded``, a floor or a peer; see
    :data:`IMPLS`) on one configuration. For ``turnstile-embedded`` ``client_cpu_s`` includes
    the embedded pool's work and ``worker_cpu_s`` is only the other P - 1 processes'."""

    impl: str
    processes: int
    slots: int
    warmup: int
    workflows: int  # measured with all clients at once (the throughput phase)
    idle_workflows: int  # measured one at a time (the latency phase)
    seconds: float  # wall time of the throughput phase
    loaded: Latencies
    idle: Latencies
    stats: ServerStats  # over the whole run: warm-up, both phases, worker start and stop
    client_cpu_s: float
    worker_cpu_s: float
    errors: list[str] = field(default_factory=list)
    server_cpu_s: float | None = None  # the local server's processes, cluster-wide
    round: int | None = None  # which of several rounds (--rounds), None for a single one

    @property
    def config(self) -> str:
        return f"{self.processes}p x {self.slots}s"

    @property
    def label(self) -> str:
        suffix = f" #{self.round}" if self.round is not None else ""
        return f"{self.config} {self.impl}{suffix}"

    @property
    def rate(self) -> float:
        """Workflows per second in the throughput phase."""
        return self.workflows / self.seconds if self.seconds else 0.0

    def per_workflow(self, value: float) -> float:
        """``value`` divided by every workflow run (warm-up and both phases)."""
        return value / max(1, self.warmup + self.workflows + self.idle_workflows)


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}%"


def _times(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _median(values: list[float]) -> float:
    return percentile(values, 50) if not any(map(math.isnan, values)) else math.nan


def _verdict(met: bool, value: float) -> str:
    return "not measured" if math.isnan(value) else "met" if met else "NOT met"


def _notes(results: list[Result]) -> list[str]:
    """The failures and missing claims of each run, and how to read the embedded runs' CPU."""
    lines: list[str] = []
    for r in results:
        # A peer has no queue, so no pickups to log.
        missing = 0 if is_peer(r.impl) else r.loaded.missing_pickups + r.idle.missing_pickups
        if r.errors or missing:
            first = f" (first: {r.errors[0]})" if r.errors else ""
            lines.append(
                f"  note: {r.label}: {len(r.errors)} failed workflows{first}; "
                f"{missing} resumes without a logged claim"
            )
    if any(r.impl == EMBEDDED for r in results):
        lines.append(
            f"  note: {EMBEDDED}: its client CPU includes the embedded pool's work; its worker "
            "CPU is only the other processes'"
        )
    return lines


def report(results: list[Result]) -> str:
    """The throughput, latency and cost tables, and the target checks."""

    # A round's run of ours is compared with the same round's floor: they ran one after
    # the other, so a machine whose speed drifts affects both alike.
    # The target's floor keeps the product's recovery guarantees; the settle-only floor
    # (earlier rounds') is shown beside it when it was measured.
    def rates(impl: str) -> dict[tuple[int, int, int | None], float]:
        return {(r.processes, r.slots, r.round): r.rate for r in results if r.impl == impl}

    floors, settle_only = rates("floor"), rates(SETTLE_ONLY)
    # Peers: each of our configurations' throughput as a multiple of theirs, same
    # configuration and round.
    peers = {impl: rates(impl) for impl in PEERS if any(r.impl == impl for r in results)}

    def share(r: Result, of: dict[tuple[int, int, int | None], float] = floors) -> float:
        base = of.get((r.processes, r.slots, r.round))
        return 100 * r.rate / base if base else math.nan

    speed_header = ["config", "workflows/s", "of floor"]
    if settle_only:
        speed_header.append("of settle-only floor")
    speed_header += [f"x {peer}" for peer in peers]
    speed_header.append("errors")
    speed = []
    for r in results:
        ours = is_ours(r.impl)
        row = [r.label, fmt(r.rate), _percent(share(r)) if ours else ""]
        if settle_only:
            row.append(_percent(share(r, settle_only)) if ours else "")
        row += [_times(share(r, of) / 100) if ours else "" for of in peers.values()]
        speed.append([*row, str(len(r.errors))])
    latency = []
    for r in results:
        latency.append([r.label, "idle", *r.idle.cells()])
        latency.append([r.label, "loaded", *r.loaded.cells()])
    cost = []
    for r in results:
        s, per = r.stats, r.per_workflow
        cost.append(
            [
                r.label,
                fmt(per(s.commits)),
                fmt(per(s.write_xacts)),
                fmt(per(s.wal_bytes) / 1024, 2),
                fmt(per(s.wal_records)),
                fmt(per(s.wal_fpi), 2),
                fmt(per(s.wal_syncs), 2),
                fmt(per(r.client_cpu_s) * 1e3, 2),
                fmt(per(r.worker_cpu_s) * 1e3, 2),
                "-" if r.server_cpu_s is None else fmt(per(r.server_cpu_s) * 1e3, 2),
            ]
        )
    lines = [
        "Throughput (all clients at once)",
        render_table(speed_header, speed),
        "",
        "Latency in ms from the resume call's start (idle: one workflow at a time;"
        " loaded: all clients at once)",
        render_table(
            [
                "config",
                "phase",
                "pickup p50",
                "p95",
                "created->pickup p50",
                "p95",
                "settled p50",
                "p95",
                "returned p50",
                "p95",
            ],
            latency,
        ),
        "",
        "Cost per workflow (over all phases; WAL, write xacts and server CPU are cluster-wide)",
        render_table(
            [
                "config",
                "commits",
                "write xacts",
                "WAL KiB",
                "WAL recs",
                "FPI",
                "WAL syncs",
                "client CPU ms",
                "worker CPU ms",
                "server CPU ms",
            ],
            cost,
        ),
        "",
        "Targets",
    ]
    configs: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if is_ours(r.impl):
            configs.setdefault((r.config, r.impl), []).append(r)
    for (config, impl), runs in configs.items():
        # Several rounds: the median of their ratios, and the p50 of all their idle pickups.
        shares = [share(r) for r in runs]
        ratio = _median(shares)
        pickup = percentile([ms for r in runs for ms in r.idle.pickup_ms], 50)
        rounds = (
            f" (median of {len(runs)} rounds: {', '.join(_percent(x) for x in shares)})"
            if len(runs) > 1
            else ""
        )
        lines.append(
            f"  {config} {impl}: {_percent(ratio)} of the floor's throughput{rounds} "
            f"(target >= 50%: {_verdict(ratio >= 50, ratio)}); idle resume->pickup p50 "
            f"{fmt(pickup, 2)} ms (target <= 5 ms: {_verdict(pickup <= 5, pickup)})"
        )
        if settle_only:
            others = [share(r, settle_only) for r in runs]
            lines.append(
                f"  {config} {impl}: {_percent(_median(others))} of the settle-only floor's "
                f"(for comparison with earlier rounds; not the target's floor)"
            )
        for peer, of in peers.items():
            times = [share(r, of) / 100 for r in runs]
            each = f" (median of {len(runs)} rounds: {', '.join(map(_times, times))})"
            lines.append(
                f"  {config} {impl}: {_times(_median(times))} {peer}'s throughput"
                f"{each if len(runs) > 1 else ''}"
            )
    lines += _notes(results)
    return "\n".join(lines)
