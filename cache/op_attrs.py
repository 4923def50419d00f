"""Op-record attributes: what each public operation reports about itself (keys in events.A_*).
Telemetry maps them onto span attributes; see docs/telemetry.md.

``OP_ATTRS[op](cache, out, args)`` builds one op's attributes from its result and the
arguments its implementation was called with (one table lookup per op on the hot path)."""

from __future__ import annotations

from collections.abc import Callable

from radixscope.cache import events as ev


def _match(cache, out, args) -> dict:
    a = {ev.A_KEY_TOKENS: out.key_len, ev.A_DEVICE_TOKENS: out.device_prefix_len,
         ev.A_HOST_TOKENS: out.host_hit_length, ev.A_SWA_HOST_TOKENS: out.swa_host_hit_length,
         ev.A_MAMBA_HOST: out.mamba_host_hit_length, ev.A_NODE: out.last_device_node,
         ev.A_BEST_NODE: out.best_match_node, ev.A_EXTRA_KEY: out.extra_key}
    if out.prefetch_status != "off":
        a[ev.A_PREFETCH_STATUS] = out.prefetch_status
        a[ev.A_PREFETCH_ASKED] = out.prefetch_tokens
        a[ev.A_STORAGE_HIT] = out.storage_hit_length
    return a


def _insert(cache, out, args) -> dict:
    return {ev.A_KEY_TOKENS: out.key_len, ev.A_PREFIX_LEN: out.prefix_len,
            ev.A_NEW_TOKENS: out.new_tokens, ev.A_NODE: out.last_node}


def _lock(cache, out, args) -> dict:
    return {ev.A_RECEIPT: out.receipt_id, ev.A_NODE: out.anchor, ev.A_OWNER: out.owner,
            ev.A_NODES: len(out.skipped)}


def _release(cache, out, args) -> dict:
    entry = args[0]
    return {ev.A_RECEIPT: entry.receipt_id, ev.A_NODE: entry.anchor, ev.A_OWNER: entry.owner}


def _alloc(cache, out, args) -> dict:
    return {ev.A_COMPONENT: cache.comps[args[0]].name, ev.A_TOKENS: out.numel()}


def _free(cache, out, args) -> dict:
    return {ev.A_COMPONENT: cache.comps[args[0]].name, ev.A_TOKENS: out}


def _evict(cache, out, args) -> dict:
    name = cache.comps[args[0]].name
    return {ev.A_COMPONENT: name, ev.A_REQUESTED: out.requested,
            ev.A_FREED_TOKENS: out.freed_of(name), ev.A_FREED: dict(out.freed),
            ev.A_NODES: len(out.evicted_nodes)}


def _backup(cache, out, args) -> dict:
    return {ev.A_TRANSFER: out, ev.A_NODE: args[0].id}


def _load_back(cache, out, args) -> dict:
    return {ev.A_NODE: out.anchor, ev.A_TRANSFER: out.transfer_id,
            ev.A_TOKENS: out.loaded_of(cache.comps[0].name), ev.A_FREED: dict(out.loaded)}


def _prefetch(cache, out, args) -> dict:
    return dict(cache._pf_attrs)


OP_ATTRS: dict[str, Callable[..., dict]] = {
    ev.OP_MATCH: _match, ev.OP_INSERT: _insert, ev.OP_LOCK: _lock, ev.OP_UNLOCK: _release,
    ev.OP_RELEASE_SWA: _release, ev.OP_ALLOC: _alloc, ev.OP_FREE: _free, ev.OP_EVICT: _evict,
    ev.OP_EVICT_HOST: _evict, ev.OP_BACKUP: _backup, ev.OP_LOAD_BACK: _load_back,
    ev.OP_PREFETCH: _prefetch,
}

