"""Issue 12 item 11: ``radixscope ui`` listens on loopback only unless ``--address`` says
otherwise, and the app opens only stores under its root (``--root``, else the store's folder),
refusing anything else (``..``, symlinks leading out) without saying whether the path exists.

The acceptance test starts the real command on a free port and reads the listening sockets of
its process group from ``/proc/net/tcp{,6}``."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from radixscope.ui.store_arg import ROOT_ENV_VAR, confine, outside_root_message, root_from_args
from tests.kits.streamlit_up import started_ui
from tests.kits.ui_store import make_store

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "ui" / "app.py")
LISTEN = "0A"


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                pids.append(int(d.name))
    return pids


def _socket_inodes(pids: list[int]) -> set[str]:
    out = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    return out


def _decode(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)  # /proc/net/tcp*: 32-bit words in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening_sockets(pgid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by the process group."""
    inodes = _socket_inodes(_group_pids(pgid))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == LISTEN and f[9] in inodes:
                addr, port = f[1].split(":")
                found.append((str(_decode(addr)), int(port, 16)))
    return found


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_radixscope_ui_listens_on_loopback_only(tmp_path):
    store = tmp_path / "run.db"
    make_store(store)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_SERVER_ADDRESS")}
    env.update(STREAMLIT_SERVER_HEADLESS="true")  # no address: the CLI's own default decides
    with started_ui(store, tmp_path, env, 90) as (proc, port):
        socks = listening_sockets(proc.pid)
        assert (port in {p for _, p in socks}), socks
        assert all(_is_loopback(a) for a, _ in socks), f"listening beyond loopback: {socks}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_radixscope_ui_headless_starts_streamlit_headless(tmp_path):
    """``--headless`` reaches Streamlit: its ``streamlit run`` process (the CLI's child, in
    the group the test started) carries ``--server.headless true``, with no environment
    variable to set it otherwise."""
    store = tmp_path / "run.db"
    make_store(store)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_SERVER_HEADLESS")}
    env.update(STREAMLIT_SERVER_ADDRESS="127.0.0.1")
    with started_ui(store, tmp_path, env, 90, args=("--headless",)) as (proc, _port):
        argvs = []
        for pid in _group_pids(proc.pid):
            try:
                argvs.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
            except OSError:
                continue
        runs = [a for a in argvs if b"streamlit" in a and b"run" in a]
        assert runs, argvs
        argv = runs[0]
        i = argv.index(b"--server.headless")
        assert argv[i + 1] == b"true", argv


# ---- the root restriction, pure -----------------------------------------------------------
@pytest.fixture()
def tree(tmp_path) -> dict[str, Path]:
    root = tmp_path / "runs"
    (root / "sub").mkdir(parents=True)
    (root / "a.db").write_bytes(b"")
    (root / "sub" / "b.db").write_bytes(b"")
    secret = tmp_path / "secret.db"
    secret.write_bytes(b"")
    (root / "out.db").symlink_to(secret)
    (root / "dangling.db").symlink_to(tmp_path / "missing.db")
    (root / "up").symlink_to(tmp_path)
    (root / "in.db").symlink_to(root / "sub" / "b.db")
    return {"root": root, "secret": secret, "tmp": tmp_path}


def test_confine_accepts_paths_under_the_root(tree):
    root = tree["root"]
    assert confine(str(root / "a.db"), str(root)) == str(root / "a.db")
    assert confine("sub/b.db", str(root)) == str(root / "sub" / "b.db")  # relative: from root
    assert confine("sub/../a.db", str(root)) == str(root / "a.db")
    assert confine("in.db", str(root)) == str(root / "sub" / "b.db")  # a link that stays inside
    assert confine("not-yet.db", str(root)) == str(root / "not-yet.db")


@pytest.mark.parametrize("typed", [
    "{tmp}/secret.db", "{tmp}/missing.db", "../secret.db", "../missing.db", "sub/../../secret.db",
    "out.db", "dangling.db", "up/secret.db", "up/missing.db", "/etc/passwd", "/etc/nothing-here",
    "/", "..", "~/x.db", "a.db\0",
])
def test_confine_refuses_paths_outside_the_root(typed, tree):
    root = tree["root"]
    typed = typed.format(tmp=tree["tmp"])
    with pytest.raises(ValueError) as info:
        confine(typed, str(root))
    assert str(info.value) == outside_root_message(typed, str(root))


def test_the_refusal_does_not_say_whether_the_path_exists(tree):
    root = str(tree["root"])
    here, absent = str(tree["secret"]), str(tree["tmp"] / "missing.db")
    msgs = []
    for p in (here, absent):
        with pytest.raises(ValueError) as info:
            confine(p, root)
        msgs.append(str(info.value).replace(repr(p), "PATH"))
    assert msgs[0] == msgs[1]


def test_root_from_args(tmp_path):
    store = tmp_path / "runs" / "x.db"
    assert root_from_args(["--store", str(store), "--root", "/usr"], {}) == "/usr"
    assert root_from_args(["--store", str(store)], {ROOT_ENV_VAR: "/usr"}) == "/usr"
    assert root_from_args(["--store", str(store)], {}) == str(tmp_path / "runs")
    assert root_from_args([], {"RADIXSCOPE_STORE": str(store)}) == str(tmp_path / "runs")
    assert root_from_args(["--rootdir", "/etc"], {}, cwd=str(tmp_path)) == str(tmp_path)


# ---- the root restriction in the app (AppTest) -------------------------------------------
@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ui-root")
    inside, outside = base / "runs" / "run.db", base / "elsewhere" / "other.db"
    inside.parent.mkdir()
    outside.parent.mkdir()
    make_store(inside)
    make_store(outside)
    (inside.parent / "link.db").symlink_to(outside)
    return {"inside": inside, "outside": outside, "base": base}


def _app(path: str, root: Path, monkeypatch) -> tuple[AppTest, list[str]]:
    from radixscope.ui import data

    monkeypatch.setenv(ROOT_ENV_VAR, str(root))
    opened: list[str] = []
    real = data.reader
    monkeypatch.setattr(data, "reader", lambda p: opened.append(str(p)) or real(p))
    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state["store_path"] = path
    at.session_state["live"] = False
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at, opened


def test_sidebar_opened_any_server_path(stores, monkeypatch):
    root = stores["inside"].parent
    for typed in (str(stores["outside"]), str(stores["base"] / "elsewhere" / "missing.db"),
                  "../elsewhere/other.db", "link.db"):
        at, opened = _app(typed, root, monkeypatch)
        assert [e.value for e in at.error] == [outside_root_message(typed, str(root))]
        assert opened == []  # refused before anything looked at the path
        assert not at.toggle  # no live toggle: the store was not accepted


def test_sidebar_opens_a_store_under_the_root(stores, monkeypatch):
    root = stores["inside"].parent
    at, opened = _app("run.db", root, monkeypatch)
    assert not at.error and str(stores["inside"]) in opened
    assert [t.label for t in at.toggle] == ["Live"]  # the sidebar accepted the store
