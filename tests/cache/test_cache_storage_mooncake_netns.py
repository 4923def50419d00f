"""The Mooncake contract tests, run in a child pytest inside a private network namespace that
holds only ``lo``: Mooncake listens on every interface whatever its flags say, so no Mooncake
process of the test suite may ever see a non-loopback address (``tests/kits/storagekit.py``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.kits.storagekit import (
    MOONCAKE_ENV,
    NETNS_ENV,
    ROOT_DIR,
    _proc_addr,
    loopback_or_wildcard,
    mooncake_missing,
)

FILES = ["tests/cache/test_cache_storage_backends.py"]  # where the mooncake-parametrised tests live
SELECT = "mooncake and not private_network_namespace"
MIN_TESTS = 8  # the mooncake contract tests when this was written; a smaller count is a loss
TIMEOUT_S = 300


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run in a new session; on timeout kill that whole process group (ours)."""
    p = subprocess.Popen(args, cwd=ROOT_DIR, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{args[:3]}... did not finish in {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(args, p.returncode, out, "")


def _unshare_or_skip() -> list[str]:
    """The command prefix entering a fresh network namespace with ``lo`` up, or skip."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.skip("needs util-linux unshare and iproute2 ip to make a loopback-only network "
                    f"namespace (unshare: {unshare}, ip: {ip})")
    probe = subprocess.run([unshare, "--net", "--", ip, "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("cannot create a private network namespace here (needs root or "
                    f"CAP_SYS_ADMIN): {probe.stderr.strip() or probe.returncode}")
    return [unshare, "--net", "--", "sh", "-c", f'"{ip}" link set lo up && exec "$0" "$@"']


def test_mooncake_backend_in_a_private_network_namespace() -> None:
    if os.environ.get(NETNS_ENV) == "1":
        pytest.skip("already inside the namespace (this is the child run)")
    why = mooncake_missing()
    if why:
        pytest.skip(why)
    prefix = _unshare_or_skip()
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES,
                   "-k", SELECT]

    collected = _run([*pytest_args, "--collect-only"], dict(os.environ), 120)
    assert collected.returncode == 0, collected.stdout[-4000:]
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(ids) >= MIN_TESTS and all(i.endswith("[mooncake]") for i in ids), collected.stdout
    expected = len(ids)

    env = {**os.environ, NETNS_ENV: "1", **MOONCAKE_ENV}
    child = _run([*prefix, *pytest_args], env, TIMEOUT_S)
    out = child.stdout
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|"
                                                r"xpassed|deselected)", summary)}
    assert child.returncode == 0, out[-6000:]
    assert counts.get("passed") == expected, (summary, out[-6000:])
    assert not {"failed", "skipped", "error", "errors"} & counts.keys(), summary


def test_the_socket_check_tells_loopback_from_other_addresses() -> None:
    """The /proc/net/tcp reading the namespace fixture relies on."""
    assert str(_proc_addr("0100007F:1F90")) == "127.0.0.1"
    assert str(_proc_addr("020200C0:1F90")) == "192.0.2.2"
    assert str(_proc_addr("0000000000000000FFFF00000100007F:0050")) == "::ffff:7f00:1"
    assert str(_proc_addr("00000000000000000000000001000000:0050")) == "::1"
    for a in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::"):
        assert loopback_or_wildcard(a), a
    for a in ("192.0.2.2", "10.0.0.1", "fd00::2", "fe80::1", "::ffff:192.0.2.2"):
        assert not loopback_or_wildcard(a), a
