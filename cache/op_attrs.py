"""Op-record attributes: what each public operation reports about itself (keys in events.A_*).
Telemetry maps them onto span attributes; see docs/telemetry.md.

``OP_ATTRS[op](cache, out, args)`` builds one op's attributes from its result and the
arguments its implementation was called with (one table lookup per op on the hot path): a
tuple in ``events.OP_FIELDS[op]`` order (``events.attrs_dict`` names it), a dict for prefetch.

The Python builders below (``PY_ATTRS``) are the reference. The hot ops' (match, insert, evict:
2.8 recorded a request; lock, alloc and unlock, once each) are also written as specs
(``SPECS``), which ``native.Fields`` runs in C: the result's slots read by offset (or the op's
arguments by index), the tuple built with no Python frame (issue 17: ~420-860 instructions an
op, the tuple included, against ~800-2,700). ``OP_ATTRS`` holds those where the native module
was built, the Python builders otherwise (``native.FieldsPy`` interprets a spec: slower than
the builder it stands for). tests/cache/test_op_attrs.py checks that all three give
equal tuples on real results."""

from __future__ import annotations

from collections.abc import Callable

from radixscope.cache import events as ev
from radixscope.cache import native
from radixscope.cache.native import ARG, DICT, GET, LEN, OR_NONE, OUT
from radixscope.cache.results import MatchResult


def _match(cache, out, args) -> tuple:
    # a type test, not ``out.prefetch_status``: on a plain match that is a class attribute, a
    # read no interpreter specializes
    if type(out) is MatchResult or out.prefetch_status == "off":
        return (out.key_len, out.device_prefix_len, out.host_hit_length, out.swa_host_hit_length,
                out.mamba_host_hit_length, out.last_device_node, out.best_match_node,
                out.extra_key, out.branch_len or None)
    return (out.key_len, out.device_prefix_len, out.host_hit_length, out.swa_host_hit_length,
            out.mamba_host_hit_length, out.last_device_node, out.best_match_node, out.extra_key,
            out.branch_len or None, out.prefetch_status, out.prefetch_tokens, out.storage_hit_length)


def _insert(cache, out, args) -> tuple:
    # args: _insert_walk's (tokens, extra_key, idx, swa, mamba_slot, prev, swa_evicted_len,
    # start, branch_len, mamba_branch_slot); no branching point is recorded as None, as spans
    # and the UI leave out
    return (out.key_len, out.prefix_len, out.new_tokens, out.last_node, args[8] or None,
            out.branch_node)


def _lock(cache, out, args) -> tuple:
    return (out.receipt_id, out.anchor, out.owner, len(out.skipped))


def _release(cache, out, args) -> tuple:
    entry = args[0]  # (``out`` is the same entry: ``Pins.release`` returns it)
    return (entry.receipt_id, entry.anchor, entry.owner)


def _alloc(cache, out, args) -> tuple:
    # args: (ci, slots, component name): ``HiRadixCache.alloc`` passes both fields
    return (cache.comps[args[0]].name, out.numel())


def _free(cache, out, args) -> tuple:
    return (cache.comps[args[0]].name, out)


def _evict(cache, out, args) -> tuple:
    name = cache.comps[args[0]].name
    freed = {}
    for comp, n in out.freed:  # a loop: ``dict(out.freed)`` takes a third longer for one pair
        freed[comp] = n
    return (name, out.requested, freed.get(name, 0), freed, len(out.evicted_nodes))


def _backup(cache, out, args) -> tuple:
    return (out, args[0].id)


def _load_back(cache, out, args) -> tuple:
    loaded = dict(out.loaded)
    return (out.anchor, out.transfer_id, loaded.get(cache.comps[0].name, 0), loaded)


def _prefetch(cache, out, args) -> dict:
    return dict(cache._pf_attrs)


PY_ATTRS: dict[str, Callable[..., tuple | dict]] = {
    ev.OP_MATCH: _match, ev.OP_INSERT: _insert, ev.OP_LOCK: _lock, ev.OP_UNLOCK: _release,
    ev.OP_RELEASE_SWA: _release, ev.OP_ALLOC: _alloc, ev.OP_FREE: _free, ev.OP_EVICT: _evict,
    ev.OP_EVICT_HOST: _evict, ev.OP_BACKUP: _backup, ev.OP_LOAD_BACK: _load_back,
    ev.OP_PREFETCH: _prefetch,
}

# The hot ops' builders as ``native.Fields`` specs: op -> (spec, keywords). A match of another
# type than ``MatchResult`` (the prefetch-aware one) goes to ``_match``; an eviction names its
# component on the result (``EvictResult.component``), which ``_evict`` looks up in the cache.
SPECS: dict[str, tuple[tuple, dict]] = {
    ev.OP_MATCH: (((OUT, "key_len"), (OUT, "device_prefix_len"), (OUT, "host_hit_length"),
                   (OUT, "swa_host_hit_length"), (OUT, "mamba_host_hit_length"),
                   (OUT, "last_device_node"), (OUT, "best_match_node"), (OUT, "extra_key"),
                   (OUT, "branch_len", OR_NONE)),
                  {"type": MatchResult, "fallback": _match}),
    # args[8]: _insert_walk's branch_len
    ev.OP_INSERT: (((OUT, "key_len"), (OUT, "prefix_len"), (OUT, "new_tokens"),
                    (OUT, "last_node"), (ARG, 8, OR_NONE), (OUT, "branch_node")), {}),
    # the freed tokens: the freed dict's (item 3) entry for the component (item 0)
    ev.OP_EVICT: (((OUT, "component"), (OUT, "requested"), (GET, 3, 0, 0),
                   (OUT, "freed", DICT), (OUT, "evicted_nodes", LEN)), {}),
    # a request's other three ops (lock, alloc, unlock: issue 17's thirty-second round)
    ev.OP_LOCK: (((OUT, "receipt_id"), (OUT, "anchor"), (OUT, "owner"),
                  (OUT, "skipped", LEN)), {}),
    # the released ``LockEntry`` (``Pins.release`` returns it)
    ev.OP_UNLOCK: (((OUT, "receipt_id"), (OUT, "anchor"), (OUT, "owner")), {}),
    # args: ``_alloc``'s (ci, slots, component name)
    ev.OP_ALLOC: (((ARG, 2), (ARG, 1)), {}),
}
SPECS[ev.OP_EVICT_HOST] = SPECS[ev.OP_EVICT]
SPECS[ev.OP_RELEASE_SWA] = SPECS[ev.OP_UNLOCK]

OP_ATTRS: dict[str, Callable[..., tuple | dict]] = dict(PY_ATTRS)
if native.KERNELS == "native":
    OP_ATTRS.update({op: native.Fields(spec, **kw) for op, (spec, kw) in SPECS.items()})
