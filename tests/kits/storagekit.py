"""Storage test kit: real ``redis-server`` and Mooncake processes on 127.0.0.1, free ports,
stopped by the fixture that started them; KV host buffers and fingerprints.

Mooncake listens on every interface whatever its host flags say (``MC_TCP_BIND_ADDRESS`` only
changes the address it advertises), so ``mooncake_cluster`` runs only inside a private network
namespace holding nothing but ``lo`` (``NETNS_ENV=1``, set by
``test_cache_storage_mooncake_netns.py``, which starts that namespace)."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from radixscope.cache.storage import Fingerprint, HostPages, page_hashes
from tests.kits.ports import free_port
from tests.kits.require import missing

ROOT_DIR = str(Path(__file__).resolve().parents[2])
REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"
NETNS_ENV = "RADIXSCOPE_NETNS_ONLY_LO"  # "1": this process runs in a loopback-only net namespace
NETNS_TEST = ("tests/cache/test_cache_storage_mooncake_netns.py::"
              "test_mooncake_backend_in_a_private_network_namespace")
MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}  # advertise (and dial) loopback only
PAGE = 4
SHAPE = (2, 3, 8)  # layers, heads, head_dim: [layers, 2, slots, heads, head_dim]


def kv_host(slots: int = 64, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> HostPages:
    """A host KV buffer of random content, as pages of ``PAGE`` slots."""
    g = torch.Generator().manual_seed(seed)
    layers, heads, head_dim = SHAPE
    buf = torch.randn((layers, 2, slots, heads, head_dim), generator=g).to(dtype)
    return HostPages(buf, PAGE, 2)


def fingerprint(host: HostPages, model: str = "test-model", component: str = "full"
                ) -> Fingerprint:
    layers, _, _, heads, head_dim = host.buf.shape
    return Fingerprint(model, str(host.buf.dtype).removeprefix("torch."), layers, heads,
                       head_dim, host.page_size, component, host.layout)


def keys_for(tokens: list[int], host: HostPages, **kw: str) -> list[str]:
    return fingerprint(host, **kw).keys(page_hashes(tokens, host.page_size))


def slots(first_page: int, n_pages: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + n_pages) * PAGE, dtype=torch.int64)


def page(host: HostPages, p: int) -> torch.Tensor:
    return host.buf[:, :, p * PAGE:(p + 1) * PAGE]


class RedisServer:
    """A ``redis-server`` on 127.0.0.1:``port`` in ``dir``, no persistence."""

    def __init__(self, dir: Path, maxmemory: str | None = None) -> None:
        self.dir = dir
        self.port = free_port()
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [REDIS_BIN, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--protected-mode", "yes"]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _need_redis() -> None:
    if not Path(REDIS_BIN).exists():
        missing("redis-server", f"redis-server not installed ({REDIS_BIN} absent; apt-get "
                                "install redis-server)")
    if importlib.util.find_spec("redis") is None:
        missing("redis-server", "the redis client library is not installed (pip install redis)")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` for one test, killed at teardown."""
    _need_redis()
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class MooncakeCluster:
    """``mooncake_master`` (with its HTTP metadata server) and a standalone ``mooncake_client``
    holding the memory segment, all on 127.0.0.1."""

    def __init__(self, dir: Path, segment: str = "256MB") -> None:
        self.dir = dir
        self.rpc, self.metrics, self.http, self.client = (free_port() for _ in range(4))
        self.segment = segment
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.rpc}"

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.http}/metadata"

    def start(self) -> None:
        master_log = open(self.dir / "master.log", "wb")  # noqa: SIM115 -- closed with the process
        env = {**os.environ, **MOONCAKE_ENV}
        self.procs.append(subprocess.Popen(
            ["mooncake_master", "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc}",
             "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics}",
             "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
             f"--http_metadata_server_port={self.http}", "--default_kv_lease_ttl=50"],
            stdout=master_log, stderr=subprocess.STDOUT, env=env))
        self._wait(lambda: self._http_ok(f"http://127.0.0.1:{self.metrics}/metrics"), "master")
        log = self.dir / "client.log"
        self.procs.append(subprocess.Popen(
            ["mooncake_client", "--host=127.0.0.1", f"--port={self.client}", "--protocol=tcp",
             f"--master_server_address={self.master}", f"--metadata_server={self.metadata}",
             f"--global_segment_size={self.segment}"],
            stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env))  # noqa: SIM115
        self._wait(lambda: b"Starting real client service" in log.read_bytes(), "client")

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ready():
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mooncake {what} did not start (logs in {self.dir})")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        self.procs = []


def mooncake_missing() -> str | None:
    """Why Mooncake tests cannot run here, or None."""
    if importlib.util.find_spec("mooncake") is None:
        return "mooncake not installed (pip install 'radixscope[mooncake]')"
    for b in ("mooncake_master", "mooncake_client"):
        if shutil.which(b) is None:
            return f"{b} not on PATH (the mooncake-transfer-engine wheel installs it)"
    if not any(Path(d).glob("libibverbs.so.1") for d in ("/usr/lib/x86_64-linux-gnu",
                                                          "/usr/lib/aarch64-linux-gnu",
                                                          "/usr/lib64", "/usr/lib")):
        return "libibverbs1 is missing (apt-get install libibverbs1)"
    return None


def net_interfaces() -> list[str]:
    """The interfaces of this process's network namespace (``/proc/self/net/dev``; unlike
    ``/sys/class/net`` it follows the reader's namespace)."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def _proc_addr(field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(field.split(":")[0])
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    return ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def tcp_sockets() -> list[tuple[str, str, str]]:
    """Every TCP socket of this network namespace as (state hex, local ip, remote ip), from
    ``/proc/self/net/tcp`` and ``tcp6`` (state ``0A``: listening)."""
    out = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            out.append((f[3], str(_proc_addr(f[1])), str(_proc_addr(f[2]))))
    return out


def loopback_or_wildcard(addr: str) -> bool:
    """127/8, ::1 (also as ::ffff:127.x) or 0.0.0.0 / :: (which reaches only ``lo`` where
    ``lo`` is the only interface)."""
    ip = ipaddress.ip_address(addr)
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


def non_loopback_sockets() -> list[tuple[str, str, str]]:
    """Sockets bound to or talking to an address that is neither loopback nor the wildcard."""
    return [s for s in tcp_sockets()
            if not (loopback_or_wildcard(s[1]) and loopback_or_wildcard(s[2]))]


def _assert_loopback_only(cluster_dir: Path) -> None:
    assert net_interfaces() == ["lo"], f"interfaces here: {net_interfaces()}"
    bad = non_loopback_sockets()
    assert bad == [], f"non-loopback sockets (logs in {cluster_dir}): {bad}"


@pytest.fixture(scope="module")
def mooncake_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeCluster]:
    """Master + standalone client, only inside a loopback-only network namespace (checked: the
    namespace has just ``lo``, and no TCP socket has a non-loopback address before, during or
    after the tests)."""
    why = mooncake_missing()
    if why:
        pytest.skip(why)
    if os.environ.get(NETNS_ENV) != "1":
        pytest.skip(f"runs only inside a loopback-only network namespace; see {NETNS_TEST}")
    cluster = MooncakeCluster(tmp_path_factory.mktemp("mooncake"))
    _assert_loopback_only(cluster.dir)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in MOONCAKE_ENV.items():  # the in-process store reads it at setup()
            mp.setenv(k, v)
        cluster.start()
        try:
            _assert_loopback_only(cluster.dir)
            yield cluster
            _assert_loopback_only(cluster.dir)
        finally:
            cluster.stop()


def run_two_ranks(module: str, tmp_path: Path, timeout: float = 120.0) -> list:
    """Run ``module._rank_main(rank, port, root, out)`` in two processes (gloo over 127.0.0.1
    on a free port), bounded by ``timeout``; returns each rank's JSON log."""
    import json
    import sys

    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-c", f"from {module} import _rank_main; "
         f"_rank_main({r}, {port}, {str(tmp_path)!r}, {str(tmp_path / f'rank{r}.json')!r})"],
        cwd=ROOT_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0].decode())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
