"""The reasoning behind ``explain_miss``: the match re-run per component and tier, and for each
place a component stopped it, what the journal says removed the data.

``Why.reasons()`` returns plain dicts (the fields of ``radixscope.telemetry.analysis.miss.explain.Reason``), in this
order: the key's sub-page tail; why FULL's path ends (page alignment, an evicted node, another
namespace, or never cached); FULL nodes on host only; then each auxiliary component that
rejects the deepest FULL node, on the device tier and on device-or-host.
"""

from __future__ import annotations

from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.events import TIER_DEVICE, TIER_HOST
from radixscope.telemetry.analysis.miss import walk as st
from radixscope.telemetry.analysis.miss.history import Event, KeyHistory

_P, _NS, _EV, _SWA, _MB, _NC = ("page_alignment", "namespace_mismatch", "evicted",
                                "swa_tombstone", "no_mamba_state", "not_cached")
_SWP = "swa_pressure"  # SWA window tombstoned under SWA pressure, FULL still resident
DEVICE, HOST = TIER_DEVICE, TIER_HOST  # the tier labels records use


class Why:
    def __init__(self, tree: st.SnapTree, walk: st.Walk, key: tuple[int, ...], ns: object,
                 window: int, hist: KeyHistory | None, names: dict[int, tuple], raw_len: int
                 ) -> None:
        self.tree, self.walk, self.key, self.ns = tree, walk, key, ns
        self.window, self.hist, self.names, self.raw_len = window, hist, names, raw_len
        self.steps = walk.steps
        self.dev = st.judge(tree, self.steps, window, host_ok=False)
        self.any = st.judge(tree, self.steps, window, host_ok=True)
        self.comb_dev = st.deepest(self.dev)
        self.comb_host = st.deepest(self.any)
        self.full_dev = st.deepest(self.dev, (BACKBONE,))
        self.full_host = st.deepest(self.any, (BACKBONE,))

    def length(self, i: int) -> int:
        return self.steps[i].end if i >= 0 else 0

    def reasons(self) -> list[dict]:
        out: list[dict] = []
        self._page_tail(out)
        if self.length(self.full_host) < len(self.key):
            self._full_path_end(out)
        if self.full_dev < self.full_host:
            self._full_host_only(out)
        if self.comb_dev < self.full_dev:
            self._aux(out, self.full_dev, host_ok=False)
        if self.comb_host < self.full_host:
            self._aux(out, self.full_host, host_ok=True)
        seen, uniq = set(), []
        for r in out:
            k = (r["code"], r["component"], r["node"])
            if k not in seen:
                seen.add(k)
                uniq.append(r)
        return uniq

    # ---- FULL ----------------------------------------------------------------------------------
    def _page_tail(self, out: list[dict]) -> None:
        tail = self.raw_len - len(self.key)
        if 0 < tail < self.tree.page:
            out.append(_r(_P, BACKBONE, HOST, None, None, None,
                          f"the key's last {tail} token(s) do not fill a page "
                          f"(page_size {self.tree.page}) and are never matched",
                          lost_tokens=tail, page_size=self.tree.page))

    def _full_path_end(self, out: list[dict]) -> None:
        pos = self.length(self.full_host)
        w, page = self.walk, self.tree.page
        found = False
        if w.stop in (st.STOP_SUB_PAGE, st.STOP_PARTIAL) and pos == w.stop_pos:
            node = w.next_node
            lost = w.common if w.stop == st.STOP_SUB_PAGE else w.common - self.steps[-1].k
            if lost > 0:
                found = True
                out.append(_r(_P, BACKBONE, HOST, node, None, None,
                              f"the key shares {lost} more token(s) with node {node} after "
                              f"token {pos}, less than a page (page_size {page}): a match "
                              "keeps whole pages only", lost_tokens=lost, at=pos, page_size=page))
        d = self.hist.deletion_covering(pos) if self.hist is not None else None
        if d is not None:
            found = True
            cause = "" if d.cause == d.node else f", cascading from the eviction of node {d.cause}"
            where = "from device (it had no host copy)" if d.tier == DEVICE else "from host"
            out.append(_r(_EV, BACKBONE, HOST, d.node, d.seq, d.op_id,
                          f"node {d.node} (key tokens [{d.start}, {d.end})) was evicted {where} "
                          f"at seq {d.seq} by {self._op(d.op_id)}{cause}",
                          start=d.start, end=d.end, last_tier=d.tier, cause_node=d.cause))
        other, length = self._best_other_namespace(pos)
        if other is not None:
            found = True
            out.append(_r(_NS, BACKBONE, HOST, None, None, None,
                          f"namespace {other!r} holds {length} tokens of this key; the request "
                          f"matched in {_ns(self.ns)}, which holds {pos}",
                          namespace=other, other_tokens=length, tokens=pos))
        if not found:
            since = self.hist.start_seq if self.hist is not None else self.tree.snap.seq
            out.append(_r(_NC, BACKBONE, HOST, None, None, None,
                          f"no node in {_ns(self.ns)} held the key past token {pos} "
                          f"(journal searched from seq {since})", at=pos, since_seq=since))

    def _best_other_namespace(self, pos: int) -> tuple[object, int]:
        best, best_len = None, pos
        for other in self.tree.namespaces():
            if other == self.ns:
                continue
            w = self.tree.walk(self.key, other)
            oks = st.judge(self.tree, w.steps, self.window, host_ok=True)
            i = st.deepest(oks, (BACKBONE,))
            n = w.steps[i].end if i >= 0 else 0
            if n > best_len:
                best, best_len = other, n
        return best, best_len

    def _full_host_only(self, out: list[dict]) -> None:
        s = self.steps[self.full_dev + 1]
        e = self._drop(s.node_id, BACKBONE, (DEVICE,))
        when = (f" at seq {e.seq} by {self._op(e.op_id)}" if e else
                " before the recorded window")
        out.append(_r(_EV, BACKBONE, DEVICE, s.node_id, e and e.seq, e and e.op_id,
                      f"node {s.node_id} (key tokens [{s.start}, {s.end})) was evicted from "
                      f"device to host{when}; a load-back can restore it",
                      start=s.start, end=s.end))

    # ---- auxiliary components ------------------------------------------------------------------
    def _aux(self, out: list[dict], i: int, host_ok: bool) -> None:
        oks = self.any if host_ok else self.dev
        for comp in self.tree.snap.components[1:]:
            if oks[comp][i]:
                continue
            if comp == WINDOW:
                self._swa(out, i, host_ok)
            elif comp == STATE:
                self._mamba(out, i, host_ok)

    def _fallback(self, host_ok: bool) -> str:
        j = self.comb_host if host_ok else self.comb_dev
        node = self.steps[j].node_id if j >= 0 else 0
        return f"the match fell back to node {node} (token {self.length(j)})"

    def _swa(self, out: list[dict], i: int, host_ok: bool) -> None:
        z = None
        for j in range(i, -1, -1):
            s = st.state_of(self.tree, self.steps[j], WINDOW)
            if not (s.device_len is not None or (host_ok and s.host_len is not None)):
                z = j
                break
        if z is None:
            return
        zs, end = self.steps[z], self.length(i)
        s = st.state_of(self.tree, zs, WINDOW)
        gone = s.device_len is None and s.host_len is None
        e = self._drop(zs.node_id, WINDOW, (DEVICE, HOST) if gone else (DEVICE,))
        what = "a tombstone" if gone else "on host only"
        if gone and e is not None and st.state_of(self.tree, zs, BACKBONE).device_len is not None:
            out.append(_r(_SWP, WINDOW, HOST, zs.node_id, e.seq, e.op_id,
                          f"the SWA window of {self.window} tokens behind token {end} (node "
                          f"{self.steps[i].node_id}) crosses node {zs.node_id} (key tokens "
                          f"[{zs.start}, {zs.end})), whose SWA window was tombstoned under SWA "
                          f"pressure at seq {e.seq} by {self._op(e.op_id)}; its FULL KV is "
                          f"still resident on device (an insert of this prefix heals it); "
                          f"{self._fallback(host_ok)}",
                          window=self.window, end=end, run=end - zs.end))
            return
        out.append(_r(_SWA if gone else _EV, WINDOW, HOST if gone else DEVICE, zs.node_id,
                      e and e.seq, e and e.op_id,
                      f"the SWA window of {self.window} tokens behind token {end} (node "
                      f"{self.steps[i].node_id}) crosses node {zs.node_id} (key tokens "
                      f"[{zs.start}, {zs.end})), whose SWA KV is {what}"
                      f"{self._since(e, zs.node_id)}; only {end - zs.end} token(s) of SWA data "
                      f"follow it; {self._fallback(host_ok)}",
                      window=self.window, end=end, run=end - zs.end))

    def _mamba(self, out: list[dict], i: int, host_ok: bool) -> None:
        s_ = self.steps[i]
        if s_.partial:
            out.append(_r(_MB, STATE, HOST, s_.node_id, None, None,
                          f"the match would end inside node {s_.node_id} (after {s_.k} of its "
                          f"{s_.node_len} tokens, at token {s_.end}): a split leaves no MAMBA "
                          f"state at the boundary; {self._fallback(host_ok)}",
                          end=s_.end, split_at=s_.k))
            return
        s = st.state_of(self.tree, s_, STATE)
        gone = s.device_len is None and s.host_len is None
        e = self._drop(s_.node_id, STATE, (DEVICE, HOST) if gone else (DEVICE,))
        what = "no MAMBA state" if gone else "its MAMBA state on host only"
        out.append(_r(_MB if gone else _EV, STATE, HOST if gone else DEVICE, s_.node_id,
                      e and e.seq, e and e.op_id,
                      f"node {s_.node_id} (ending at token {s_.end}) has {what}"
                      f"{self._since(e, s_.node_id)}; {self._fallback(host_ok)}", end=s_.end))

    # ---- words -----------------------------------------------------------------------------------
    def _drop(self, node: int, comp: str, tiers: tuple[str, ...]) -> Event | None:
        if self.hist is None:
            return None
        evs = [e for t in tiers if (e := self.hist.last_drop(node, comp, t)) is not None]
        return max(evs, key=lambda e: e.seq) if evs else None

    def _since(self, e: Event | None, node: int) -> str:
        if e is not None:
            return f" since seq {e.seq} ({self._op(e.op_id)})"
        born = self.hist.born.get(node) if self.hist is not None else None
        if born is None:
            return " (since before the recorded window)"
        how, b = born
        verb = "created by a split" if how == "split" else "created"
        return f" (never held it: {verb} at seq {b.seq} by {self._op(b.op_id)})"

    def _op(self, op_id: int) -> str:
        op, req = self.names.get(op_id, (None, None))
        if op is None:
            return f"op {op_id}"
        return f"{op} (op {op_id}{', req ' + str(req) if isinstance(req, str) else ''})"


def _r(code: str, comp: str, tier: str, node: int | None, seq: int | None, op_id: int | None,
       text: str, **details: object) -> dict:
    return {"code": code, "component": comp, "tier": tier, "node": node, "seq": seq,
            "op_id": op_id, "text": text, "details": tuple(sorted(details.items()))}


def _ns(ns: object) -> str:
    return "the default namespace" if ns is None else f"namespace {ns!r}"
