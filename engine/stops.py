"""How a run that hit a problem stops: the result's report, the crash bundle, the rule.

Every problem names, where it can, the cache operation it was found at (``op``, ``op_id``,
the op's last ``seq``), the nodes involved and the broken rule (an invariant's name, or the
rule a guard enforces: ``content.verify``, ``lock.released_at_request_end``,
``admission.guarantee``, ``load_back.anchor_accepted``). The bundle written for it carries the
same names, so the post-mortem notebook and the UI's Health page show them.
"""

from __future__ import annotations

import traceback

from radixscope.cache import events as ev
from radixscope.cache.errors import CacheOutOfMemory, InvariantViolation
from radixscope.engine.engine import EngineStuck
from radixscope.engine.instrument import OpViolation
from radixscope.engine.lifecycle import LeakedLock
from radixscope.engine.model import ContentMismatch


class BudgetBroken(RuntimeError):
    """A strict run: an admitted request's load-back or first chunk ran out of memory."""

    rule = "admission.guarantee"

    def __init__(self, violation, oom: CacheOutOfMemory) -> None:
        self.violation = violation
        self.oom = oom
        self.req_id = violation.req_id
        self.nodes = () if violation.anchor is None else (violation.anchor,)
        super().__init__(f"request {violation.req_id} passed admission but its "
                         f"{violation.stage} ran out of memory: {oom}")


def stop_on_budget(violation, oom: CacheOutOfMemory) -> None:
    """``Admitter.on_violation`` of a strict run: stop at the first broken guarantee."""
    raise BudgetBroken(violation, oom) from oom


def _op_node(op) -> list[int]:
    """The node an op record names (its ``node`` attribute), as a list."""
    node = (op.attrs or {}).get(ev.A_NODE) if op is not None else None
    return [node] if isinstance(node, int) and not isinstance(node, bool) else []


def op_violation(e: OpViolation, step: int) -> dict:
    """The report of ``check()`` failing right after one cache call. A pool-wide violation
    (a ledger, a pool's conservation) names no node: the op's own node stands for it."""
    name, node, detail = e.violation.violations[0]
    op = e.op
    nodes = list(dict.fromkeys(v[1] for v in e.violation.violations if v[1] is not None))
    nodes = nodes or _op_node(op)
    return {"message": f"step {step}: {e}", "invariant": name, "rule": name, "node": node,
            "nodes": nodes,
            "detail": detail, "step": step, "call": e.call, "req_id": e.req_id,
            "op_id": op.op_id if op else None, "op": op.op if op else None,
            "seq": op.seq_last if op else None,
            "violations": [list(v) for v in e.violation.violations]}


def _blame(result, e: BaseException) -> dict:
    """The op the problem was found at (the last one recorded), the rule and the nodes."""
    op = result.counter.last_op
    nodes = list(getattr(e, "nodes", ()) or ()) or _op_node(op)
    return {"op": op.op if op else None, "op_id": op.op_id if op else None,
            "seq": op.seq_last if op else None, "req_id": getattr(e, "req_id", None)
            or (op.req_id if op else None), "rule": getattr(e, "rule", None), "nodes": nodes,
            "node": nodes[0] if nodes else None}


def stopped(result, e: Exception, engine, bundles, locate) -> None:
    """Fill ``result`` (error, kind, violation) for ``e`` and write its bundle when the cache's
    own error hook did not. ``locate(step, violation)`` names the op behind a violation a
    step-level ``check()`` found (``engine.run.locate``)."""
    step = engine.step_no
    dump = bundles.dump if bundles is not None else (lambda **kw: None)
    if isinstance(e, OpViolation):
        result.error_kind = "invariant"
        result.violation = op_violation(e, step)
        result.error = result.violation["message"]
        v = result.violation
        dump(note=result.error, exc=e.violation, op=v["op"], op_id=v["op_id"], rule=v["rule"],
             nodes=v["nodes"])
    elif isinstance(e, InvariantViolation) and getattr(e, "rule", None):
        # an op's own guard (the prefetch stop commit): the op's record and its bundle name it
        result.error_kind = "invariant"
        blame = _blame(result, e)
        name, _node, detail = e.violations[0]
        result.error = f"step {step}: invariant {name} broken in op #{blame['op_id']} " \
                       f"{blame['op']}: {detail}"
        result.violation = {"message": result.error, "step": step, "invariant": name,
                            "detail": detail, "violations": [list(v) for v in e.violations],
                            **blame}
        if bundles is not None and not bundles.bundled(e):
            dump(note=result.error, exc=e, op=blame["op"], op_id=blame["op_id"],
                 rule=blame["rule"], nodes=blame["nodes"])
    elif isinstance(e, InvariantViolation):  # the step-level check(): its hook bundled it
        result.error_kind = "invariant"
        result.violation = locate(step, e)
        result.error = result.violation["message"]
    elif isinstance(e, ContentMismatch | LeakedLock | BudgetBroken):
        blame = _blame(result, e)
        if isinstance(e, ContentMismatch):
            result.error_kind = "content"
            blame.update(component=e.component, position=e.position, slot=e.slot)
        elif isinstance(e, LeakedLock):
            result.error_kind = "leak"
            blame.update(nodes=list(e.nodes), node=e.nodes[0] if e.nodes else None,
                         receipts={str(r): a for r, a in e.anchors.items()})
        else:
            result.error_kind = "budget"
            blame.update(stage=e.violation.stage, admission=e.violation.admission)
        result.error = str(e) if isinstance(e, ContentMismatch) else f"step {step}: {e}"
        result.violation = {"message": result.error, "step": step, **blame}
        dump(note=result.error, exc=e.oom if isinstance(e, BudgetBroken) else e,
             op=blame["op"], op_id=blame["op_id"], rule=blame["rule"], nodes=blame["nodes"])
    elif isinstance(e, EngineStuck):
        result.error, result.error_kind = str(e), "stuck"
    else:  # a bug in the engine, model or workload, or a cache operation that raised
        result.error_kind = "crash"
        result.error = f"step {step}: the engine raised {type(e).__name__}: {e}"
        result.violation = {"exception": type(e).__name__, "message": str(e), "step": step,
                            "traceback": traceback.format_exc()[-8000:], **_blame(result, e)}
        if bundles is not None and not bundles.bundled(e):  # the cache's hook did not
            bundles.dump(note=f"engine crash: {result.error}", exc=e, op="engine")


__all__ = ["BudgetBroken", "op_violation", "stop_on_budget", "stopped"]
