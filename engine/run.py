"""One engine run from plain settings: workload, cache config, telemetry store, outcome.

``execute(spec)`` builds the cache (``CacheConfig.preset`` plus overrides), the workload, the
telemetry store, runs the engine and returns a ``RunResult``. It never raises for a broken
invariant, a content mismatch or an exception inside the engine (a crash: bundled, with its
traceback in the result): those end the run and are reported in the result (and recorded in
the store, so ``radixscope doctor`` reports them). With ``check_invariants``, a violation found after a step is located exactly by
re-running the (deterministic) run with a check after every cache call from that step on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from radixscope.cache import zoo
from radixscope.cache.components import NAMES
from radixscope.cache.config import PRESET_OF_COMPONENTS, PRESETS, CacheConfig
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.hiradix import HiRadixCache
from radixscope.cache.memory import check_fits
from radixscope.cache.storage.factory import open_backend
from radixscope.cache.storage.prefetch_policy import PrefetchConfig, StopPolicy
from radixscope.cache.storage.setup import STORE_POLICIES, StorageSetup
from radixscope.engine import workloads
from radixscope.engine.bundles import RunBundles
from radixscope.engine.engine import Engine, EngineConfig
from radixscope.engine.instrument import CountingRecorder, OpViolation, TimedCache
from radixscope.engine.stops import op_violation, stop_on_budget, stopped

Hook = Callable[[Engine], None]
STORAGE_SCHEMES = ("file:", "redis://", "mooncake://")
PREFETCH_POLICIES = tuple(p.value for p in StopPolicy)
SIZE_FIELDS = ("page_size", "device_tokens", "host_tokens", "swa_device_tokens",
               "swa_host_tokens", "mamba_slots", "mamba_host_slots")
# pools sized in tokens: a preset's follow ``page_size`` when only it is set (a user's are
# taken as given, and refused by CacheConfig when not whole pages)
_TOKEN_POOLS = ("device_tokens", "host_tokens", "swa_device_tokens", "swa_host_tokens")


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs; None means "the preset's / workload's default" (the preset
    defaults to ``hybrid``: FULL + SWA + MAMBA)."""

    workload: str = "chat"
    requests: int | None = None
    seed: int = 0
    preset: str | None = None
    components: tuple[str, ...] | None = None
    write_policy: str = "write_through"
    sizes: dict = field(default_factory=dict)  # SIZE_FIELDS -> int
    store: str | None = "runs/latest.db"
    check_invariants: bool = False
    chunk_tokens: int = 256
    prefill_budget: int = 512
    max_running: int = 16
    trace: str | None = None
    workload_options: dict = field(default_factory=dict)  # knobs of the workload generator
    telemetry_mode: str = "process"  # "inline": sinks on this thread, no request spans (tests)
    storage: str | None = None  # L3: "file:DIR", "redis://HOST:PORT", "mooncake://..."
    prefetch_policy: str = "timeout"
    storage_write: str = "write_through"
    prefetch_threshold: int = 256
    load_back_threshold: int = 0  # host hits shorter than this (FULL only) are not loaded back
    device: str | None = None  # the device pools: 'cpu', 'cuda', 'cuda:N'; None: cuda if present

    def preset_name(self) -> str:
        if self.components is not None:
            comps = tuple(self.components)
            name = PRESET_OF_COMPONENTS.get(comps)
            if name is None:
                raise ValueError(f"components={','.join(comps)!r}: must be one of "
                                 f"{', '.join(','.join(k) for k in PRESET_OF_COMPONENTS)}")
            if self.preset is not None and self.preset != name:
                if self.preset not in PRESETS:
                    raise ValueError(f"unknown preset {self.preset!r}")
                have = ",".join(PRESETS[self.preset]["components"])
                raise ValueError(f"--components {','.join(comps)} does not match --preset "
                                 f"{self.preset} (components {have})")
            return name
        name = self.preset or "hybrid"
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
        return name

    def cache_config(self) -> CacheConfig:
        name = self.preset_name()
        over = {}
        for k, v in self.sizes.items():
            if k not in SIZE_FIELDS:
                raise ValueError(f"unknown pool size {k!r}; choose from {', '.join(SIZE_FIELDS)}")
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{k}={v!r} must be an int >= 0")
                comp = k.split("_")[0]
                if comp in NAMES and comp not in PRESETS[name]["components"]:
                    raise ValueError(f"{k}={v} is for the {comp!r} component, which preset "
                                     f"{name!r} does not have")
                over[k] = v
        page = over.get("page_size", PRESETS[name]["page_size"])
        for k in _TOKEN_POOLS if page >= 1 else ():  # the preset's token pools, rounded down
            # to whole pages (a page size < 1 is CacheConfig's to refuse)
            if k not in over and PRESETS[name].get(k) is not None:
                over[k] = max(page, PRESETS[name][k] // page * page)
        return CacheConfig.preset(name, write_policy=self.write_policy, device=self.device,
                                  load_back_threshold=self.load_back_threshold, **over)

    def storage_setup(self, observer=None, backend=None):
        """The cache's L3 tier (None without ``storage``); opens the backend unless ``backend``
        (``open_storage``'s) is given. ``observer``: the prefetch observer (telemetry's
        ``tel.prefetch_observer``: L3 spans, metrics and events). Bad values raise ValueError
        naming them."""
        self.check_storage()
        if self.storage is None:
            return None
        return StorageSetup(backend if backend is not None else open_backend(self.storage),
                            write_policy=self.storage_write, prefetch=self._prefetch_config(),
                            observer=observer)

    def open_storage(self):
        """The L3 backend ``storage`` names, opened (None without one); the caller closes it.
        ``execute`` opens it before the telemetry store, so a target refused at open (a file
        directory that cannot be used, a malformed spec, a Mooncake store that does not
        answer, a Redis server that does not answer its ``probe``) leaves the previous run's
        store alone. Once the run is going, an outage shows as failed L3 pages in its summary."""
        self.check_storage()
        if self.storage is None:
            return None
        backend = open_backend(self.storage)
        try:
            backend.probe()
        except BaseException:
            backend.close()
            raise
        return backend

    def check_storage(self) -> None:
        """Validate the storage settings without opening anything."""
        if self.storage is not None and (not isinstance(self.storage, str) or not
                                         self.storage.startswith(STORAGE_SCHEMES)):
            raise ValueError(f"storage={self.storage!r}: expected file:DIR, redis://HOST:PORT "
                             "or mooncake://HOST:PORT?metadata=URL")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"prefetch_policy={self.prefetch_policy!r}: must be one of "
                             f"{', '.join(PREFETCH_POLICIES)}")
        if self.storage_write not in STORE_POLICIES:
            raise ValueError(f"storage_write={self.storage_write!r}: must be one of "
                             f"{', '.join(STORE_POLICIES)}")
        self._prefetch_config()

    def _prefetch_config(self) -> PrefetchConfig:
        return PrefetchConfig(policy=self.prefetch_policy,
                              threshold_tokens=self.prefetch_threshold)

    def engine_config(self, check_each_from: int | None = None) -> EngineConfig:
        return EngineConfig(chunk_tokens=self.chunk_tokens, prefill_budget=self.prefill_budget,
                            max_running=self.max_running, check_invariants=self.check_invariants,
                            check_each_from=check_each_from)


@dataclass
class RunResult:
    spec: RunSpec
    config: CacheConfig
    engine: Engine
    counter: CountingRecorder
    cache: TimedCache
    wall_s: float
    store: str | None
    error: str | None = None  # content mismatch, invariant violation or stuck engine
    error_kind: str | None = None  # "content", "invariant", "stuck", "crash" (engine raised)
    violation: dict | None = None
    bundles: list = field(default_factory=list)  # crash bundles written during the run
    injection: object = None  # the zoo fault installed (``radixscope.cache.zoo.Injection``)
    detected_op_id: int | None = None  # the cache's op id when the run stopped on a problem
    strict: bool = False  # check() after every cache call (``strict``, ``--inject``)
    # the L3 tier's counters at the end, read before ``execute`` closes the backend
    storage_stats: object = None
    # telemetry's health at close (``Telemetry.close()``): failures, dropped records
    telemetry_stats: dict | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.engine.admitter.budget_violations


def _open_telemetry(path: str | None, mode: str):
    if path is None:
        return None
    from radixscope import telemetry

    # process mode (the CLI) routes this process's spans (the request spans) into the store
    # through the global tracer provider; inline mode (tests) leaves the global provider alone
    return telemetry.setup(store=path, overwrite=True, mode=mode,
                           capture_host_spans=mode == "process")


def _build(spec: RunSpec, recorder_inner, check_each_from: int | None,
           hooks: list[Hook], tel, backend=None
           ) -> tuple[Engine, CountingRecorder, TimedCache, CacheConfig]:
    cfg = spec.cache_config()
    reqs = workloads.build(spec.workload, spec.requests, spec.seed, spec.trace,
                           **spec.workload_options)
    counter = CountingRecorder(recorder_inner)
    storage = spec.storage_setup(getattr(tel, "prefetch_observer", None), backend)
    hc = HiRadixCache(cfg, recorder=counter, storage=storage)
    try:
        cache = TimedCache(hc, counter)
        engine = Engine(cache, reqs, spec.engine_config(check_each_from), telemetry=tel,
                        model_name=f"standin-{spec.preset_name()}", on_step=_chain(hooks))
    except BaseException:  # the caller never gets the cache: stop its L3 workers here
        hc.close()
        raise
    return engine, counter, cache, cfg


def _chain(hooks: list[Hook]) -> Hook | None:
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None

    def run_all(engine: Engine) -> None:
        for h in hooks:
            h(engine)
    return run_all


def execute(spec: RunSpec, on_step: Hook | None = None, fault: Hook | None = None, *,
            inject: str | None = None, strict: bool = False) -> RunResult:
    """Run ``spec``. Bad settings (or pools too big for the memory available) raise
    ValueError before anything starts.

    Args:
        spec: the settings.
        on_step: called after every step (a progress bar).
        fault: called after every step before ``on_step``, in the run and in the re-run that
            locates a violation (tests inject faults with it).
        inject: a bug-zoo fault to install on the cache (``radixscope.cache.zoo``; tests and
            ``radixscope run --inject`` only). Implies ``strict``.
        strict: ``check()`` after every cache call, and stop at the first admitted request that
            runs out of memory; every problem stops the run with a bundle naming the op.
    """
    if inject is not None and inject not in zoo.names():
        raise zoo.UnknownFault(f"unknown fault {inject!r}; the zoo has: {', '.join(zoo.names())}")
    strict = strict or inject is not None
    if inject is not None:
        # a zoo run is located by re-running it, which needs a run that repeats: the CPU's
        # (under CUDA a poll acks only the copies the side stream has finished, so a re-run
        # can take other steps)
        if spec.device not in (None, "cpu"):
            raise ValueError(f"--inject runs on the CPU (its locating re-run must repeat the "
                             f"run), not on device={spec.device!r}: drop --device")
        spec = replace(spec, device="cpu")
    if inject is not None and zoo.faults()[inject].needs_storage:
        _check_storage_fault(spec, inject)
    check_fits(spec.cache_config())  # validate, and fit in memory, before opening a store
    spec.check_storage()
    workloads.build(spec.workload, 1 if spec.workload != "trace" else spec.requests, spec.seed,
                    spec.trace, **spec.workload_options)
    spec.engine_config()
    backend = spec.open_storage()  # a bad L3 target is refused before the store is replaced
    try:
        tel = _open_telemetry(spec.store, spec.telemetry_mode)
    except BaseException:
        if backend is not None:
            backend.close()
        raise
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine's tensors are small: intra-op threads only cost
    bundles = None
    cache = None
    try:
        engine, counter, cache, cfg = _build(spec, tel.recorder if tel else None,
                                             1 if strict else None, [fault, on_step], tel,
                                             backend)
        result = RunResult(spec, cfg, engine, counter, cache, 0.0, spec.store, strict=strict)
        if inject is not None:
            result.injection = zoo.inject(cache.cache, inject)
            if tel is not None:
                tel.record_event("zoo.inject", result.injection.describe())
        if tel is not None:
            bundles = RunBundles(cache.cache, spec.store, tel)
            engine.on_step = _chain([engine.on_step, bundles.service])
        if strict:
            engine.admitter.on_violation = stop_on_budget
        t0 = time.perf_counter()
        try:
            engine.run()
        except KeyboardInterrupt:
            if tel is not None:
                tel.record_violation(f"the run was interrupted at step {engine.step_no}",
                                     kind="interrupted")
            raise
        except Exception as e:  # noqa: BLE001 - every problem ends the run with a report
            result.detected_op_id = cache.cache.current_op_id
            stopped(result, e, engine, bundles,
                    lambda step, found: locate(spec, step, found, fault))
        result.wall_s = time.perf_counter() - t0
        if bundles is not None:
            result.bundles = bundles.written
        if result.error is not None:
            if tel is not None:  # recorded before abort, which may fail after a crash
                details = dict(result.violation or {})
                details["bundles"] = [str(p) for p in result.bundles]
                if result.injection is not None:
                    details["injection"] = result.injection.describe()
                tel.record_violation(result.error, kind=result.error_kind, details=details)
            _abort(engine, result)
    finally:
        try:  # L3: stop the prefetch worker and the store writer, then the backend
            try:
                if cache is not None:
                    _close(cache.cache, result if "result" in locals() else None)
                    if "result" in locals() and cache.cache.storage is not None:
                        result.storage_stats = cache.cache.storage_stats()
            finally:
                if backend is not None:  # execute opened it: the cache does not close it
                    backend.close()
        finally:  # a close that raises still leaves the bundles and telemetry closed
            if bundles is not None:
                bundles.close()
            if tel is not None:
                stats = tel.close()
                if "result" in locals():
                    result.telemetry_stats = stats
            torch.set_num_threads(threads)
    return result


def _check_storage_fault(spec: RunSpec, name: str) -> None:
    """A zoo fault in the L3 prefetch needs an L3 tier whose prefetch fetches pools."""
    if spec.storage is None or len(PRESETS[spec.preset_name()]["components"]) < 2:
        raise ValueError(f"--inject {name} needs --storage and a preset with a SWA or MAMBA "
                         f"component (got storage={spec.storage!r}, preset "
                         f"{spec.preset_name()!r})")


def _abort(engine: Engine, result: RunResult) -> None:
    """Release what the engine holds; after a crash or a broken invariant the cache may be
    inconsistent (a pinned node deleted), so a failure here is noted in the result instead of
    hiding the problem that stopped the run."""
    try:
        engine.abort()
    except Exception as e:  # noqa: BLE001
        if result.error_kind not in ("crash", "invariant"):
            raise
        _cleanup_failed(result, "abort", e)


def _cleanup_failed(result: RunResult, what: str, e: Exception) -> None:
    """Note a failed clean-up after the run stopped: a crash's message says so; an invariant
    problem's report (already recorded in the store) lists it under ``cleanup``."""
    if result.error_kind == "crash":
        result.error += f" (and {what} failed: {type(e).__name__}: {e})"
    else:
        (result.violation or {}).setdefault("cleanup", []).append(
            f"{what} failed: {type(e).__name__}: {e}")


def _close(cache: HiRadixCache, result: RunResult | None) -> None:
    """Stop the L3 prefetch worker and the store writer (acking what they finished). After a
    run stopped on a problem, a failure here is noted, not raised (the same reason as
    ``_abort``)."""
    try:
        cache.close()
    except Exception as e:  # noqa: BLE001
        if result is None or result.error is None:
            raise
        _cleanup_failed(result, "closing the cache", e)


def locate(spec: RunSpec, step: int, original: InvariantViolation, fault: Hook | None = None
           ) -> dict:
    """Re-run ``spec`` without a store, checking after every cache call from ``step`` on, to
    name the operation that first broke an invariant seen after ``step``."""
    engine = backend = None
    try:
        backend = spec.open_storage()
        engine, *_ = _build(replace(spec, store=None), None, step, [fault], None, backend)
        engine.run()
    except OpViolation as e:
        return op_violation(e, engine.step_no)
    except Exception:  # noqa: BLE001 - fall back to the step-level report below
        pass
    finally:
        try:
            if engine is not None:
                engine.cache.cache.close()
        finally:
            if backend is not None:
                backend.close()
    name, node, detail = original.violations[0]
    at = f"at node {node}" if node is not None else "(pool-wide)"
    return {"message": f"step {step}: invariant {name} broken {at}: {detail} (the re-run could "
                       "not name the operation)",
            "invariant": name, "node": node, "detail": detail, "step": step, "op": None,
            "op_id": None, "req_id": None, "seq": None,
            "violations": [list(v) for v in original.violations]}


__all__ = ["RunSpec", "RunResult", "execute", "locate", "PRESET_OF_COMPONENTS", "SIZE_FIELDS"]
