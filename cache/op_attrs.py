"""Op-record attributes: what each public operation reports about itself (keys in events.A_*).
Telemetry maps them onto span attributes; see docs/telemetry.md."""

from __future__ import annotations

from cache import events as ev


def op_attrs(cache, op: str, out, args) -> dict:
    """The attributes of one op record, from the op's result and arguments."""
    if op == ev.OP_MATCH:
        return {ev.A_KEY_TOKENS: out.key_len, ev.A_DEVICE_TOKENS: out.device_prefix_len,
                ev.A_HOST_TOKENS: out.host_hit_length, ev.A_SWA_HOST_TOKENS: out.swa_host_hit_length,
                ev.A_MAMBA_HOST: out.mamba_host_hit_length, ev.A_NODE: out.last_device_node,
                ev.A_BEST_NODE: out.best_match_node, ev.A_EXTRA_KEY: out.extra_key}
    if op == ev.OP_INSERT:
        return {ev.A_KEY_TOKENS: out.key_len, ev.A_PREFIX_LEN: out.prefix_len,
                ev.A_NEW_TOKENS: out.new_tokens, ev.A_NODE: out.last_node}
    if op == ev.OP_LOCK:
        return {ev.A_RECEIPT: out.receipt_id, ev.A_NODE: out.anchor, ev.A_OWNER: out.owner,
                ev.A_NODES: len(out.skipped)}
    if op in (ev.OP_UNLOCK, ev.OP_RELEASE_SWA):
        entry = args[0]
        return {ev.A_RECEIPT: entry.receipt_id, ev.A_NODE: entry.anchor, ev.A_OWNER: entry.owner}
    if op == ev.OP_ALLOC:
        return {ev.A_COMPONENT: cache.comps[args[0]].name, ev.A_TOKENS: out.numel()}
    if op == ev.OP_FREE:
        return {ev.A_COMPONENT: cache.comps[args[0]].name, ev.A_TOKENS: out}
    if op in (ev.OP_EVICT, ev.OP_EVICT_HOST):
        return {ev.A_COMPONENT: cache.comps[args[1]].name, ev.A_REQUESTED: out.requested,
                ev.A_FREED_TOKENS: out.freed_of(cache.comps[args[1]].name),
                ev.A_FREED: dict(out.freed), ev.A_NODES: len(out.evicted_nodes)}
    if op == ev.OP_BACKUP:
        return {ev.A_TRANSFER: out, ev.A_NODE: args[1].id}
    if op == ev.OP_LOAD_BACK:
        return {ev.A_NODE: out.anchor, ev.A_TRANSFER: out.transfer_id,
                ev.A_TOKENS: out.loaded_of("full"), ev.A_FREED: dict(out.loaded)}
    return {}
