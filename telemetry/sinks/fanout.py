"""The fan-out: one batch of messages -> the journal replica -> every sink, each call guarded.

``Fanout.handle`` takes a batch of messages (see ``telemetry/record/encode.py``), replays the
mutations into its ``Journal`` (the replica every sink may read, given at ``attach``) and hands
each op batch with its accepted mutations, each event, the attach, flush and close to every
``Sink`` (``telemetry/sinks/base.py``) in order: the built-in spans, metrics and store, and any
registered one. A sink with a ``cuts`` method (the store: its pool samples) may ask for an op
batch to be handed over in sub-batches, so that it reads the replica at those ops: each
sub-batch comes with its own mutations only (up to its last op's ``seq_last``), accepted into
the replica just before. The same class runs in the writer process (process mode) or on the
drain thread (inline mode). A failing sink call is logged and counted (``sink.<Class>.<method>``),
never raised, and the other sinks still get the call.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.record.drops import Health, merge_stats
from radixscope.telemetry.record.encode import decode_records
from radixscope.telemetry.sinks.base import Sink
from radixscope.telemetry.store.journal import Journal

# message kinds only some sinks take, by the optional method of that name
_OPTIONAL_KINDS = ("spans", "violation")


class Fanout:
    """Consumes telemetry messages and fans them out to every sink.

    Args:
        health: this side's counters.
        sinks: the sinks by name, in call order (``sinks.base.build``); each gets ``bind``
            (if it has one) once here.
    """

    def __init__(self, health: Health, sinks: Mapping[str, Sink]) -> None:
        self.health = health
        self.named: dict[str, Sink] = dict(sinks)
        self.sinks: list[Sink] = list(self.named.values())
        self.journal: Journal | None = None
        self.host_stats: dict = {}
        self.ops_seen = 0
        self.closed = False
        self._final: dict = {}
        self._stage = {id(s): f"sink.{type(s).__name__}." for s in self.sinks}
        self._commit = [s for s in self.sinks if hasattr(s, "commit")]
        self._cutters = [s for s in self.sinks if hasattr(s, "cuts")]
        for sink in self.sinks:
            if hasattr(sink, "bind"):
                with self._guard(sink, "bind"):
                    sink.bind(self)

    def stats(self) -> dict:
        """Host-side and sink-side health merged."""
        return merge_stats(self.host_stats, self.health.snapshot())

    # ---- message handling ------------------------------------------------------------------
    def handle(self, messages: Iterable[tuple]) -> None:
        """Process a batch of messages; then each sink's ``commit`` (the store commits once)."""
        if self.closed:
            return
        for msg in messages:
            kind = msg[0]
            with self.health.guard(f"sink.{kind}"):
                if kind == "ops":
                    self._ops(*decode_records(msg[1]))
                elif kind == "event":
                    self._each("event", *msg[1:])
                elif kind == "attach":
                    self._attach(msg[1], msg[2])
                elif kind == "host_stats":
                    self.host_stats = msg[1]
                elif kind in _OPTIONAL_KINDS:
                    self._each(kind, *msg[1:], optional=True)
                else:
                    raise ValueError(f"unknown telemetry message kind {kind!r}")
        for sink in self._commit:
            with self._guard(sink, "commit"):
                sink.commit()

    def _attach(self, info: dict, snapshot: dict) -> None:
        if self.journal is not None:
            raise RuntimeError("a second cache attached to the same telemetry; ignored")
        snap = CacheSnapshot.from_dict(snapshot)
        self.journal = Journal(snap, self.health)
        self._each("attach", info, snap, self.journal)

    def _ops(self, ops: list, muts: list[tuple]) -> None:
        """One op batch, cut where a sink asks (``_cuts``): each sub-batch's ops with the
        mutations up to its last op's ``seq_last``; the rest with the last sub-batch."""
        cuts = self._cuts(ops) if self._cutters and ops else ()
        if not cuts:
            self._deliver(ops, muts)
            return
        muts = sorted(muts, key=_SEQ)
        op_at = mut_at = 0
        for i in cuts:
            upto = bisect.bisect_right(muts, ops[i].seq_last, lo=mut_at, key=_SEQ)
            self._deliver(ops[op_at:i + 1], muts[mut_at:upto])
            op_at, mut_at = i + 1, upto
        self._deliver(ops[op_at:], muts[mut_at:])

    def _cuts(self, ops: Sequence) -> list[int]:
        """The op indices after which some sink asked a sub-batch to end, sorted, each but
        the batch's last op (a failing ``cuts`` is counted and asks for none)."""
        out: set[int] = set()
        n = len(ops) - 1
        for sink in self._cutters:
            try:
                got = sink.cuts(ops)  # type: ignore[attr-defined]
                if got:  # whatever a sink returns: in-range ints only
                    out.update(i for i in got if type(i) is int and 0 <= i < n)
            except Exception as e:  # noqa: BLE001 - guard point: log + count, no cuts
                self.health.fail(self._stage[id(sink)] + "cuts", e)
        return sorted(out)

    def _deliver(self, ops: list, muts: list[tuple]) -> None:
        """Accept ``muts`` into the replica, then hand ``ops`` with them to every sink."""
        j = self.journal
        accepted = j.accept(muts) if j is not None else sorted(muts, key=_SEQ)
        self.ops_seen += len(ops)
        health, stage = self.health, self._stage
        for sink in self.sinks:
            try:
                sink.ops(ops, accepted)
            except Exception as e:  # noqa: BLE001 - guard point: log + count, next sink
                health.fail(stage[id(sink)] + "ops", e)

    def _each(self, method: str, *args: Any, optional: bool = False) -> None:
        """Call ``method`` on every sink (that has it, when ``optional``), each guarded."""
        for sink in self.sinks:
            fn = getattr(sink, method, None) if optional else getattr(sink, method)
            if fn is not None:
                with self._guard(sink, method):
                    fn(*args)

    def _guard(self, sink: Sink, method: str) -> Any:
        return self.health.guard(self._stage[id(sink)] + method)

    # ---- lifecycle -------------------------------------------------------------------------
    def flush(self) -> dict:
        """Every sink's ``flush`` (exporters pushed, the store's final sample, stats, commit).

        Returns:
            This side's own health snapshot (the host merges it with its own).
        """
        if self.closed:
            return self._final
        self._each("flush")
        return self.health.snapshot()

    def close(self, clean: bool = True) -> dict:
        """Each sink's ``end(clean)``; then the sinks that export (spans, metrics, KV events,
        any registered one) flush and close; then the sinks that keep the record
        (``records_close = True``: the store) take the final flush and close. Idempotent.

        The recording sinks close last so that what goes wrong while the exporters shut down
        (an OTLP push that fails, a publisher that cannot send its tail) is counted in the
        stats the store keeps and the host's ``close()`` returns, not lost after them.

        Args:
            clean: the host closed telemetry (``tel.close()``); False when the writer closes
                because its host process went away without closing (killed, crashed), so
                readers of the store can tell the run did not finish.

        Returns:
            This side's health snapshot, taken after the exporters closed.
        """
        if self.closed:
            return self._final
        self._each("end", clean, optional=True)
        last = [s for s in self.sinks if getattr(s, "records_close", False)]
        first = [s for s in self.sinks if s not in last]
        for method in ("flush", "close"):
            for sink in first:
                with self._guard(sink, method):
                    getattr(sink, method)()
        for sink in last:
            with self._guard(sink, "flush"):
                sink.flush()
        self._final = self.health.snapshot()
        self.closed = True
        for sink in last:
            with self._guard(sink, "close"):
                sink.close()
        return self._final


_SEQ = operator.itemgetter(0)
