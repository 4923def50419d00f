"""What ``bench_scale.py`` makes of its timings: the ops a run timed, match calls by path
depth, and issue 17's targets that one run can judge."""

from __future__ import annotations

import math
import statistics

OPS = ("match", "lock", "evict", "alloc", "insert", "unlock")
NOT_OPS = ("request", "hit", "victims", "asked", "ancestors", "depth", "aside",
           "floor")  # per-batch lists
DEPTH_MIN = 100  # match calls a path depth needs before its median and p99 are reported


def ops_in(batches: list[dict]) -> list[str]:
    """The timed ops of a run, in ``OPS`` order then the per-component ones (sorted)."""
    seen = {op for b in batches for op, v in b.items() if isinstance(v, list) and v}
    seen -= set(NOT_OPS)
    return [op for op in OPS if op in seen] + sorted(seen - set(OPS))


def timed_ops_s(batch: dict) -> float:
    """One batch's ops/s as issue 17's table counts it: match, insert and evict calls (every
    component's) over the CPU time of those calls alone."""
    evicts = [op for op in batch if op.startswith("evict")]
    timed = sum(sum(batch[op]) for op in ("match", "insert", *evicts)) / 1e9
    return (2 * batch["n"] + sum(len(batch[op]) for op in evicts)) / timed


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values``: the k-th
    smallest and k-th largest, k the largest for which the two tails of Binomial(n, 1/2) below
    k hold at most ``1 - level`` between them (n = 12 pairs: the 3rd and 10th, 96 %). With too
    few values for ``level`` (n < 6 at 95 %): their min and max."""
    v = sorted(values)
    n = len(v)
    if not n:
        raise ValueError("median_ci: no values")
    k, tail = 0, 0.0
    while k < n // 2:
        tail += math.comb(n, k) / 2 ** n  # P(X = k), X ~ Binomial(n, 1/2)
        if 2 * tail > 1 - level:
            break
        k += 1
    k = max(k, 1)
    return v[k - 1], v[n - k]


def median_line(costs: list[float]) -> str:
    """``median X %, 95 % interval A-B %`` of the pair costs."""
    lo, hi = median_ci(costs)
    return (f"median {statistics.median(costs) * 100:.1f} %, 95 % interval {lo * 100:.1f}-"
            f"{hi * 100:.1f} %")


def paired_costs(base: list[dict], tel: list[dict]) -> list[float]:
    """Telemetry's cost in ops/s, batch pair by batch pair: ``1 - ops/s(telemetry) / ops/s
    (baseline)`` for the i-th batch of each. The two caches run the same requests in the same
    order, batch i of one right after batch i of the other, so a slow spell of the machine
    falls on both of a pair more often than on the best batch of each (the ratio of best
    batches, on this project's noisy 2-core machines, read 4.6 % and 16.1 % in two runs of the
    same hot path at 100 k nodes); their median, with ``median_ci``'s interval, is what the
    target is judged on."""
    return [1 - timed_ops_s(t) / timed_ops_s(b) for b, t in zip(base, tel, strict=True)]


def by_depth(calls: list[tuple[int, int]]) -> dict | None:
    """Match calls by the device path they walked (nodes from the root to the match's last
    device node): the cost per node (a line through each depth's median) and the worst
    p99/median within one depth, over depths with at least ``DEPTH_MIN`` calls."""
    groups: dict[int, list[int]] = {}
    for d, ns in calls:
        groups.setdefault(d, []).append(ns)
    rows = []
    for d in sorted(groups):
        v = sorted(groups[d])
        if len(v) >= DEPTH_MIN:
            rows.append((d, statistics.median(v) / 1e3, v[int(len(v) * 0.99)] / 1e3))
    if len(rows) < 2:
        return None
    slope, base = statistics.linear_regression([r[0] for r in rows], [r[1] for r in rows])
    worst = max(rows, key=lambda r: r[2] / r[1])
    return {"depths": (rows[0][0], rows[-1][0]), "base": base, "per_node": slope,
            "worst": (worst[0], worst[2] / worst[1])}


def floor_excess(floor: list[tuple[float, float]], median_us: float) -> float:
    """What the machine alone adds to the p99 of an op whose median is ``median_us``: the p99
    less the median of fixed work (``scale_probes.Floor``, ``(median, p99)`` per size, by
    median) of that median, interpolated between the two sizes around it on a log scale of
    the median, and the nearest size's outside them."""
    if not floor:
        raise ValueError("floor_excess: no sizes")
    if median_us <= floor[0][0]:
        return floor[0][1] - floor[0][0]
    for (m0, p0), (m1, p1) in zip(floor, floor[1:], strict=False):
        if median_us <= m1:
            w = math.log(median_us / m0) / math.log(m1 / m0) if m1 > m0 else 1.0
            return (p0 - m0) + w * ((p1 - m1) - (p0 - m0))
    return floor[-1][1] - floor[-1][0]


def tail_verdict(s: dict, ops: list[str], floor: list[tuple[float, float]] | None
                 ) -> tuple[str, float, bool | None, str]:
    """p99 <= 3x median, every op, for one run's summary ``s``: (the worst op, its p99/median,
    the verdict, a note). Met when every op holds. An op over 3x whose p99 is within 3x its
    median plus the machine's own excess at that median (``floor_excess`` of ``floor``, a
    floor run's "floor") cannot be told from the machine: unsure, the note naming
    those ops and what the machine adds. NOT met when any op is over both, or over 3x with no
    floor."""
    op, ratio = max(((o, s[o][1] / s[o][0]) for o in ops), key=lambda x: x[1])
    over = [o for o in ops if s[o][1] > 3.0 * s[o][0]]
    if not over:
        return op, ratio, True, ""
    if not floor:
        return op, ratio, False, ""
    adds = {o: floor_excess(floor, s[o][0]) for o in over}
    if any(s[o][1] > 3.0 * s[o][0] + adds[o] for o in over):
        return op, ratio, False, ""
    return op, ratio, None, "; within the machine's floor: " + ", ".join(
        f"{o} {s[o][1]:.1f} us <= 3 x {s[o][0]:.1f} + {adds[o]:.1f}" for o in over)


def print_targets(scale: str, runs: list, sums: list[dict], closes: list[float],
                  comps: tuple[str, ...] = ("full",),
                  floor: list[tuple[float, float]] | None = None) -> None:
    """Issue 17's targets that one run can judge, each with its figure and whether it holds
    (store bytes per op and the per-evict ratio compare two scales: run both). The request's
    85 us and telemetry's 5 % are set on FULL alone (SGLang's classic cache has no SWA or
    MAMBA): with other components their figures are printed, not judged. The p99 target is
    judged against the machine's ``floor`` as well, where there is one (``tail_verdict``)."""
    full = tuple(comps) == ("full",)
    rows = []
    for r, s in zip(runs, sums, strict=True):
        op, ratio, ok, note = tail_verdict(s, [*ops_in(r.batches), "request"], floor)
        rows.append((f"p99 <= 3x median, every op ({r.label})", f"{op} {ratio:.2f}x{note}", ok))
    if scale == "100k":
        mem = runs[0].mem_per_token
        rows.append(("memory <= 50 B/resident token", f"{mem:.1f}", mem <= 50))
    if len(runs) > 1 and runs[1].tel is not None:  # (a control cache comes after it)
        b, t = sums[:2]
        rows.append(("request with telemetry <= 85 us (median)", f"{t['request'][0]:.1f} us",
                     t["request"][0] <= 85 if full else "info"))
        costs = paired_costs(runs[0].batches, runs[1].batches)
        cost = statistics.median(costs)
        lo, hi = median_ci(costs)
        # judged on the interval: one run's median moves by points with the machine's noise
        rows.append(("telemetry costs <= 5 % of ops/s (median of the batch pairs)",
                     f"{cost * 100:.1f} % (95 % interval {lo * 100:.1f}-{hi * 100:.1f} %, pairs "
                     f"{min(costs) * 100:.1f}-{max(costs) * 100:.1f} %, best batches "
                     f"{(1 - t['ops_s'] / b['ops_s']) * 100:.1f} %)",
                     (True if hi <= 0.05 else False if lo > 0.05 else None) if full
                     else "info"))
        rows.append(("close() <= 1 s", f"{closes[1]:.2f} s", closes[1] <= 1.0))
    print("  issue 17 targets (unsure: the figure's 95 % interval spans the target, or a tail "
          "the machine's floor explains" + ("" if full else "; not judged: a target set on "
                                             "FULL alone") + "):")
    for what, value, ok in rows:
        print(f"    {VERDICTS[ok]:<10}  {what}: {value}")


VERDICTS = {True: "met", False: "NOT met", None: "unsure", "info": "not judged"}
