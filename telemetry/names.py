"""Every span, attribute and metric name telemetry emits, in one place.

OpenTelemetry naming rules hold for all of them: lowercase, dot-separated namespaces, snake_case
parts, low-cardinality span names, and no attribute name that is also a namespace of another.
Node ids, receipt ids and request ids appear on spans only; metric labels are limited to the
closed sets listed in ``METRIC_LABELS``. ``docs/telemetry.md`` lists every name here and
``tests/telemetry/test_telemetry_names.py`` holds the two equal.
"""

from __future__ import annotations

from radixscope.cache import events as ev

INSTRUMENTATION_SCOPE = "radixscope.telemetry"
# the L3 spans the prefetch observer makes in the cache's process: a scope of their own, so the
# store keeps them as host spans (it skips INSTRUMENTATION_SCOPE: op rows carry those)
STORAGE_INSTRUMENTATION_SCOPE = "radixscope.telemetry.storage"
DEFAULT_SERVICE_NAME = "radixscope"

# ---- span names: one per public cache operation ----------------------------------------------
SPAN_PREFIX = "kv_cache."
SPAN_MATCH = "kv_cache.match"
SPAN_INSERT = "kv_cache.insert"
SPAN_LOCK = "kv_cache.lock"
SPAN_UNLOCK = "kv_cache.unlock"
SPAN_RELEASE_SWA = "kv_cache.release_swa"
SPAN_ALLOC = "kv_cache.alloc"
SPAN_FREE = "kv_cache.free"
SPAN_EVICT = "kv_cache.evict"
SPAN_EVICT_HOST = "kv_cache.evict_host"
SPAN_BACKUP = "kv_cache.backup"
SPAN_LOAD_BACK = "kv_cache.load_back"
SPAN_PREFETCH = "kv_cache.prefetch"
SPAN_STORE = "kv_cache.store"  # starts a host -> L3 store transfer
SPAN_CHECK = "kv_cache.check"
SPAN_TRANSFER = "kv_cache.transfer"  # asynchronous copy, linked to the op that enqueued it
SPAN_OTHER = "kv_cache.other"  # an op name this version does not know
# L3 storage (``telemetry/record/prefetch.py``, from the prefetch controller's events): one span
# per prefetch (start .. hand-back, progress as span events), storage calls as its children
SPAN_STORAGE_PREFETCH = "kv_cache.storage_prefetch"
SPAN_STORAGE_EXISTS = "kv_cache.storage_exists"
SPAN_STORAGE_GET = "kv_cache.storage_get"
SPAN_STORAGE_SET = "kv_cache.storage_set"
STORAGE_SPAN_NAMES = (SPAN_STORAGE_PREFETCH, SPAN_STORAGE_EXISTS, SPAN_STORAGE_GET,
                      SPAN_STORAGE_SET)
EVENT_PREFETCH_PROGRESS = "kv_cache.prefetch.progress"  # span event on the prefetch span

SPAN_NAMES: dict[str, str] = {
    ev.OP_MATCH: SPAN_MATCH, ev.OP_INSERT: SPAN_INSERT, ev.OP_LOCK: SPAN_LOCK,
    ev.OP_UNLOCK: SPAN_UNLOCK, ev.OP_RELEASE_SWA: SPAN_RELEASE_SWA, ev.OP_ALLOC: SPAN_ALLOC,
    ev.OP_FREE: SPAN_FREE, ev.OP_EVICT: SPAN_EVICT, ev.OP_EVICT_HOST: SPAN_EVICT_HOST,
    ev.OP_BACKUP: SPAN_BACKUP, ev.OP_LOAD_BACK: SPAN_LOAD_BACK, "prefetch": SPAN_PREFETCH,
    "store": SPAN_STORE,
    ev.OP_CHECK: SPAN_CHECK, ev.OP_TRANSFER: SPAN_TRANSFER,
}

# ---- attributes present on every cache span --------------------------------------------------
ATTR_OP_ID = "kv_cache.op.id"
ATTR_OP_MUTATIONS = "kv_cache.op.mutations"  # mutations the op made
ATTR_SEQ = "kv_cache.seq"  # journal seq after the op: state_at(seq) is the tree it left
ATTR_REQUEST_ID = "kv_cache.request.id"
ATTR_ERROR_TYPE = "error.type"  # OTel semantic convention; set when the op raised

# ---- attributes carried over from an op record's ``attrs`` (events.A_* -> name) --------------
ATTR_COMPONENT = "kv_cache.component"
ATTR_TIER = "kv_cache.tier"
ATTR_NODE_ID = "kv_cache.node.id"
ATTR_NODE_COUNT = "kv_cache.node.count"  # lock: nodes skipped; evict: evicted; transfer: copied
ATTR_KEY_TOKENS = "kv_cache.key.tokens"
ATTR_EXTRA_KEY = "kv_cache.key.extra"
ATTR_MATCH_DEVICE_TOKENS = "kv_cache.match.device_tokens"
ATTR_MATCH_HOST_TOKENS = "kv_cache.match.host_tokens"
ATTR_MATCH_SWA_HOST_TOKENS = "kv_cache.match.swa_host_tokens"
ATTR_MATCH_MAMBA_HOST_STATES = "kv_cache.match.mamba_host_states"
ATTR_MATCH_BEST_NODE_ID = "kv_cache.match.best_node.id"
ATTR_INSERT_PREFIX_TOKENS = "kv_cache.insert.prefix_tokens"
ATTR_INSERT_NEW_TOKENS = "kv_cache.insert.new_tokens"
# branching points (``MatchResult.branch_len``): where FULL's match reaches past SWA / MAMBA's,
# and the node an insert ended there, keeping the SWA window / MAMBA state behind it
ATTR_MATCH_BRANCH_TOKENS = "kv_cache.match.branch_tokens"
ATTR_INSERT_BRANCH_TOKENS = "kv_cache.insert.branch_tokens"
ATTR_INSERT_BRANCH_NODE_ID = "kv_cache.insert.branch_node.id"
ATTR_LOCK_RECEIPT_ID = "kv_cache.lock.receipt_id"
ATTR_LOCK_OWNER = "kv_cache.lock.owner"
ATTR_REQUESTED_TOKENS = "kv_cache.requested_tokens"
ATTR_EVICT_FREED_TOKENS = "kv_cache.evict.freed_tokens"
ATTR_EVICT_FREED_PREFIX = "kv_cache.evict.freed"  # namespace: kv_cache.evict.freed.<component>
ATTR_LOAD_BACK_LOADED_PREFIX = "kv_cache.load_back.loaded"  # namespace: .<component>
ATTR_TRANSFER_SLOTS_PREFIX = "kv_cache.transfer.slots"  # namespace: .<component>
ATTR_TOKENS = "kv_cache.tokens"
ATTR_BYTES = "kv_cache.bytes"
ATTR_TRANSFER_ID = "kv_cache.transfer.id"
ATTR_TRANSFER_KIND = "kv_cache.transfer.kind"
ATTR_TRANSFER_ENQUEUED_BY = "kv_cache.transfer.enqueued_by"  # op id of the enqueuing op
ATTR_TRANSFER_COPY_NS = "kv_cache.transfer.copy_ns"  # CUDA: the copies' time on the side stream
ATTR_OTHER_PREFIX = "kv_cache.attr"  # namespace for op attrs this version does not know

# events.A_* key -> span attribute. A dict value (per component) becomes one attribute per
# component under the mapped name as a namespace (only ``A_FREED`` is documented as one).
OP_ATTRIBUTES: dict[str, str] = {
    ev.A_DEVICE_TOKENS: ATTR_MATCH_DEVICE_TOKENS,
    ev.A_HOST_TOKENS: ATTR_MATCH_HOST_TOKENS,
    ev.A_SWA_HOST_TOKENS: ATTR_MATCH_SWA_HOST_TOKENS,
    ev.A_MAMBA_HOST: ATTR_MATCH_MAMBA_HOST_STATES,
    ev.A_KEY_TOKENS: ATTR_KEY_TOKENS,
    ev.A_NODE: ATTR_NODE_ID,
    ev.A_BEST_NODE: ATTR_MATCH_BEST_NODE_ID,
    ev.A_PREFIX_LEN: ATTR_INSERT_PREFIX_TOKENS,
    ev.A_NEW_TOKENS: ATTR_INSERT_NEW_TOKENS,
    ev.A_RECEIPT: ATTR_LOCK_RECEIPT_ID,
    ev.A_OWNER: ATTR_LOCK_OWNER,
    ev.A_FREED_TOKENS: ATTR_EVICT_FREED_TOKENS,
    ev.A_FREED: ATTR_EVICT_FREED_PREFIX,
    ev.A_REQUESTED: ATTR_REQUESTED_TOKENS,
    ev.A_NODES: ATTR_NODE_COUNT,
    ev.A_TOKENS: ATTR_TOKENS,
    ev.A_BYTES: ATTR_BYTES,
    ev.A_TRANSFER: ATTR_TRANSFER_ID,
    ev.A_TRANSFER_KIND: ATTR_TRANSFER_KIND,
    ev.A_ENQUEUED_BY: ATTR_TRANSFER_ENQUEUED_BY,
    ev.A_COPY_NS: ATTR_TRANSFER_COPY_NS,
    ev.A_EXTRA_KEY: ATTR_EXTRA_KEY,
    ev.A_COMPONENT: ATTR_COMPONENT,
    ev.A_BRANCH: ATTR_MATCH_BRANCH_TOKENS,
    ev.A_BRANCH_NODE: ATTR_INSERT_BRANCH_NODE_ID,
}
# The hand-back op record's keys (``cache/events.py`` A_PREFETCH_*; mapped once the cache has them)
_PREFETCH_RECORD_KEYS = (("A_PREFETCH_REASON", "ATTR_PREFETCH_REASON"),
                         ("A_PREFETCH_ASKED", "ATTR_PREFETCH_ASKED_TOKENS"),
                         ("A_PREFETCH_HIT", "ATTR_PREFETCH_HIT_TOKENS"),
                         ("A_PREFETCH_FOUND", "ATTR_PREFETCH_FOUND_TOKENS"),
                         ("A_PREFETCH_SECONDS", "ATTR_PREFETCH_SECONDS"),
                         ("A_STORAGE_FAILED", "ATTR_STORAGE_FAILED_PAGES"),
                         ("A_PREFETCH_STATUS", "ATTR_PREFETCH_STATUS"),
                         ("A_STORAGE_HIT", "ATTR_MATCH_STORAGE_TOKENS"))
# Where one key means different things per op, the op's own name wins.
OP_ATTRIBUTE_OVERRIDES: dict[tuple[str, str], str] = {
    (ev.OP_LOAD_BACK, ev.A_FREED): ATTR_LOAD_BACK_LOADED_PREFIX,
    (ev.OP_TRANSFER, ev.A_FREED): ATTR_TRANSFER_SLOTS_PREFIX,
    (ev.OP_INSERT, ev.A_BRANCH): ATTR_INSERT_BRANCH_TOKENS,
}
# mapped names that are namespaces: a per-component dict becomes ``<name>.<component>``
DICT_ATTRIBUTES = frozenset({ATTR_EVICT_FREED_PREFIX, ATTR_LOAD_BACK_LOADED_PREFIX,
                             ATTR_TRANSFER_SLOTS_PREFIX})

# ---- attributes of the storage spans ---------------------------------------------------------
ATTR_PREFETCH_REASON = "kv_cache.prefetch.reason"
ATTR_PREFETCH_STATUS = "kv_cache.prefetch.status"  # match: started / ongoing / done / declined
ATTR_MATCH_STORAGE_TOKENS = "kv_cache.match.storage_tokens"  # host hit a prefetch brought
ATTR_PREFETCH_POLICY = "kv_cache.prefetch.policy"
ATTR_PREFETCH_ASKED_TOKENS = "kv_cache.prefetch.asked_tokens"
ATTR_PREFETCH_HIT_TOKENS = "kv_cache.prefetch.hit_tokens"  # tokens handed back into the tree
ATTR_PREFETCH_FOUND_TOKENS = "kv_cache.prefetch.found_tokens"  # storage reported present
ATTR_PREFETCH_COMPLETED_TOKENS = "kv_cache.prefetch.completed_tokens"
ATTR_PREFETCH_SECONDS = "kv_cache.prefetch.seconds"
ATTR_STORAGE_BACKEND = "kv_cache.storage.backend"
ATTR_STORAGE_STATUS = "kv_cache.storage.status"
ATTR_STORAGE_PAGES = "kv_cache.storage.pages"
ATTR_STORAGE_BYTES = "kv_cache.storage.bytes"
ATTR_STORAGE_FAILED_PAGES = "kv_cache.storage.failed_pages"
STORAGE_ATTRIBUTES = (ATTR_PREFETCH_REASON, ATTR_PREFETCH_STATUS, ATTR_MATCH_STORAGE_TOKENS,
                      ATTR_PREFETCH_POLICY, ATTR_PREFETCH_ASKED_TOKENS,
                      ATTR_PREFETCH_HIT_TOKENS, ATTR_PREFETCH_FOUND_TOKENS,
                      ATTR_PREFETCH_COMPLETED_TOKENS, ATTR_PREFETCH_SECONDS,
                      ATTR_STORAGE_BACKEND, ATTR_STORAGE_STATUS, ATTR_STORAGE_PAGES,
                      ATTR_STORAGE_BYTES, ATTR_STORAGE_FAILED_PAGES)
OP_ATTRIBUTES.update({getattr(ev, k): globals()[a] for k, a in _PREFETCH_RECORD_KEYS
                      if hasattr(ev, k)})

# ---- link attributes (transfer span -> enqueuing op span) ------------------------------------
LINK_ATTR_OP_ID = ATTR_OP_ID

# ---- metric label keys (closed, low-cardinality value sets) ----------------------------------
LABEL_COMPONENT = ATTR_COMPONENT  # full | swa | mamba
LABEL_TIER = ATTR_TIER  # device | host
LABEL_OP = "kv_cache.op.name"  # one of events.OPS
LABEL_TRANSFER_KIND = ATTR_TRANSFER_KIND
LABEL_RECORD = "kv_cache.telemetry.record"  # op | mutation | span | event
LABEL_STAGE = "kv_cache.telemetry.stage"  # where a telemetry failure happened
LABEL_ADMISSION_RESULT = "kv_cache.admission.result"  # admitted | rejected
LABEL_PREFETCH_REASON = ATTR_PREFETCH_REASON  # prefetch_events R_* and page statuses
LABEL_STORAGE_OP = "kv_cache.storage.op"  # exists | get | set
LABEL_STORAGE_STATUS = ATTR_STORAGE_STATUS  # ok | a PageStatus value

# ---- metrics ---------------------------------------------------------------------------------
UNIT_SLOTS = "{slot}"  # tokens for KV pools, states for MAMBA pools
UNIT_TOKENS = "{token}"

M_POOL_CAPACITY = "kv_cache.pool.capacity"
M_POOL_AVAILABLE = "kv_cache.pool.available"
M_POOL_EVICTABLE = "kv_cache.pool.evictable"
M_POOL_PROTECTED = "kv_cache.pool.protected"
M_POOL_IN_FLIGHT = "kv_cache.pool.in_flight"
M_POOL_HELD = "kv_cache.pool.held"
M_HIT_TOKENS = "kv_cache.hit.tokens"
M_LOOKUP_TOKENS = "kv_cache.lookup.tokens"
M_EVICTED_TOKENS = "kv_cache.evicted.tokens"
M_BACKUP_TOKENS = "kv_cache.backup.tokens"
M_BACKUP_BYTES = "kv_cache.backup.bytes"
M_LOAD_BACK_TOKENS = "kv_cache.load_back.tokens"
M_LOAD_BACK_BYTES = "kv_cache.load_back.bytes"
M_OP_DURATION = "kv_cache.op.duration"
M_TRANSFER_DURATION = "kv_cache.transfer.duration"
M_ADMISSIONS = "kv_cache.admission.decisions"
M_STORE_TOKENS = "kv_cache.storage.store.tokens"  # host -> L3, from acked store transfers
M_STORE_BYTES = "kv_cache.storage.store.bytes"
M_PREFETCH_ENDED = "kv_cache.prefetch.ended"
M_PREFETCH_TOKENS = "kv_cache.prefetch.tokens"  # L3 -> host, handed back
M_PREFETCH_FOUND_TOKENS = "kv_cache.prefetch.found_tokens"  # found by the existence query
M_PREFETCH_UNFULFILLED = "kv_cache.prefetch.unfulfilled.tokens"
M_STORAGE_BYTES = "kv_cache.storage.bytes"
M_STORAGE_PAGES = "kv_cache.storage.pages"
M_STORAGE_BANDWIDTH = "kv_cache.storage.bandwidth"
M_TELEMETRY_DROPPED = "kv_cache.telemetry.dropped"
M_TELEMETRY_FAILURES = "kv_cache.telemetry.failures"

POOL_GAUGES = (M_POOL_CAPACITY, M_POOL_AVAILABLE, M_POOL_EVICTABLE, M_POOL_PROTECTED,
               M_POOL_IN_FLIGHT, M_POOL_HELD)

METRIC_LABELS: dict[str, tuple[str, ...]] = {
    **{g: (LABEL_COMPONENT, LABEL_TIER) for g in POOL_GAUGES},
    M_HIT_TOKENS: (LABEL_COMPONENT, LABEL_TIER),
    M_LOOKUP_TOKENS: (),
    M_EVICTED_TOKENS: (LABEL_COMPONENT, LABEL_TIER),
    M_BACKUP_TOKENS: (LABEL_COMPONENT,),
    M_BACKUP_BYTES: (),
    M_LOAD_BACK_TOKENS: (LABEL_COMPONENT,),
    M_LOAD_BACK_BYTES: (),
    M_OP_DURATION: (LABEL_OP,),
    M_TRANSFER_DURATION: (LABEL_TRANSFER_KIND,),
    M_ADMISSIONS: (LABEL_ADMISSION_RESULT,),
    M_STORE_TOKENS: (LABEL_COMPONENT,),
    M_STORE_BYTES: (),
    M_PREFETCH_ENDED: (LABEL_PREFETCH_REASON,),
    M_PREFETCH_TOKENS: (LABEL_COMPONENT,),
    M_PREFETCH_FOUND_TOKENS: (LABEL_COMPONENT,),
    M_PREFETCH_UNFULFILLED: (LABEL_PREFETCH_REASON,),
    M_STORAGE_BYTES: (LABEL_STORAGE_OP, LABEL_COMPONENT),
    M_STORAGE_PAGES: (LABEL_STORAGE_OP, LABEL_STORAGE_STATUS, LABEL_COMPONENT),
    M_STORAGE_BANDWIDTH: (LABEL_STORAGE_OP, LABEL_COMPONENT),
    M_TELEMETRY_DROPPED: (LABEL_RECORD,),
    M_TELEMETRY_FAILURES: (LABEL_STAGE,),
}

# Bucket bounds (seconds) for op and transfer durations: cache ops take microseconds.
# Bucket bounds (bytes/s) of storage call bandwidth: 1 MB/s .. 100 GB/s.
BANDWIDTH_BUCKETS = (1e6, 1e7, 5e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 1e11)
DURATION_BUCKETS_S = (2e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                      1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)

# ---- store event kinds (``events`` table) ----------------------------------------------------
EVENT_ADMISSION = "admission"
# the prefetch controller's events (``cache/storage/prefetch_events``), as the observer puts
# them into the store: same kinds, attrs plus ``asked_tokens`` on the end
EVENT_PREFETCH_START = "prefetch.start"
EVENT_PREFETCH_END = "prefetch.end"
EVENT_STORAGE_PREFIX = "storage."


def attribute_name(op: str, key: str) -> str:
    """The span attribute an op record's ``attrs[key]`` becomes.

    Args:
        op: the op name.
        key: an ``events.A_*`` key (or any other key the cache adds).

    Returns:
        The mapped name; ``kv_cache.attr.<key>`` for keys this version does not know.
    """
    name = OP_ATTRIBUTE_OVERRIDES.get((op, key)) or OP_ATTRIBUTES.get(key)
    if name is not None:
        return name
    return f"{ATTR_OTHER_PREFIX}." + "".join(c if c.isalnum() else "_" for c in key.lower())


def span_name(op: str) -> str:
    """The span name of a cache operation.

    Args:
        op: an op name from ``cache.events`` (``"match"``, ``"transfer"``, ...).

    Returns:
        ``kv_cache.<op>`` for known ops, else ``kv_cache.other`` (span names stay low-cardinality).
    """
    return SPAN_NAMES.get(op, SPAN_OTHER)


def all_span_names() -> tuple[str, ...]:
    """Every span name telemetry can emit (for docs and tests)."""
    return tuple(sorted(set(SPAN_NAMES.values()) | {SPAN_OTHER, *STORAGE_SPAN_NAMES}))


def all_attribute_names() -> tuple[str, ...]:
    """Every span attribute name (namespaces of dict attributes listed with a ``.<component>``
    suffix as documented), for docs and tests."""
    fixed = {ATTR_OP_ID, ATTR_OP_MUTATIONS, ATTR_SEQ, ATTR_REQUEST_ID, ATTR_ERROR_TYPE}
    mapped = {n for n in (*OP_ATTRIBUTES.values(), *OP_ATTRIBUTE_OVERRIDES.values())
              if n not in DICT_ATTRIBUTES}
    dicts = {f"{n}.<component>" for n in DICT_ATTRIBUTES}
    return tuple(sorted(fixed | mapped | dicts | set(STORAGE_ATTRIBUTES)
                        | {f"{ATTR_OTHER_PREFIX}.<key>"}))


def all_metric_names() -> tuple[str, ...]:
    """Every metric instrument name, for docs and tests."""
    return tuple(sorted(METRIC_LABELS))
