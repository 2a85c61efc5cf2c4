"""A shared cache a team can trust (issue 16), against the real SeaweedFS server,
machines simulated as processes with local folders of their own:

- a clear on one machine stops the others from serving their local copies: at
  once for a process started after it, within ``revalidate_after`` for a running
  one; a new, empty bucket at the same URL is not answered from old copies;
- two keys on one cache do not fight: the second computes, warns once, and
  never overwrites the first's entries;
- a server that cannot be reached (a wrong endpoint, or gone mid-run) never
  fails a call: one warning, results computed, caching back when it answers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache import Memory
from mlcache.errors import CacheWarning
from mlcache.memo.layout import is_entry

pytest.importorskip("s3fs")

#: the botocore client gives up on an unreachable server at once (not after its
#: default retries, several seconds per request)
_FAST = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}


def source(n: int, where: str) -> np.ndarray:
    """What a cached function reads that its key does not name (the reason a team
    clears a cache): the number in the file ``where``."""
    with open(f"{where}.calls", "a") as log:
        log.write(f"{os.getpid()}\n")
    return np.full(n, float(Path(where).read_text()))


def _calls(where: Path) -> int:
    log = Path(f"{where}.calls")
    return log.read_text().count("\n") if log.exists() else 0


def _memory(url: str, options: dict[str, Any], local: str, **kw: Any) -> Memory:
    store = {k: kw.pop(k) for k in ("revalidate_after",) if k in kw}
    return Memory(
        url,
        verbose=0,
        secret=kw.pop("secret", "team secret"),
        backend_options={**options, "local_cache_dir": str(local), **store},
        **kw,
    )


def _machine(conn: Any, url: str, options: dict[str, Any], local: str, kw: dict[str, Any]) -> None:
    """A machine: its own process and local folder, running what it is sent."""
    import faulthandler

    faulthandler.dump_traceback_later(100, exit=True)  # a stuck machine says where
    env = kw.pop("env", {})
    os.environ.update(env)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        mem = _memory(url, options, local, **kw)
        f = mem.cache(source, ignore=["where"])
        while True:
            cmd, args = conn.recv()
            try:
                if cmd == "stop":
                    break
                if cmd == "call":
                    out: Any = float(f(*args)[0])
                elif cmd == "clear":
                    f.clear()
                    out = None
                elif cmd == "clear all":
                    mem.clear()
                    out = None
                else:
                    raise ValueError(cmd)
                conn.send(("ok", out))
            except Exception as exc:
                conn.send(("error", repr(exc)))
        conn.send(("said", [str(w.message) for w in said if issubclass(w.category, CacheWarning)]))


class Machine:
    def __init__(self, url: str, options: dict[str, Any], local: Path, **kw: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=_machine, args=(theirs, url, options, str(local), kw), daemon=True
        )  # daemon: a failed test leaves no machine running
        self.proc.start()

    def do(self, cmd: str, *args: Any) -> Any:
        self.conn.send((cmd, args))
        assert self.conn.poll(120), f"machine stuck on {cmd}"
        status, out = self.conn.recv()
        assert status == "ok", out
        return out

    def stop(self) -> list[str]:
        """Stop it; the CacheWarnings it said."""
        self.conn.send(("stop", ()))
        status, said = self.conn.recv()
        self.proc.join(60)
        assert status == "said" and self.proc.exitcode == 0
        return said


@pytest.fixture
def data(tmp_path: Path) -> Path:
    where = tmp_path / "data-version"
    where.write_text("1")
    return where


@pytest.mark.slow  # processes: a few seconds each
def test_a_clear_reaches_a_process_started_after_it_at_once(s3_bucket, tmp_path, data):
    url, options = s3_bucket
    url += "/c"
    here = _memory(url, options, tmp_path / "a").cache(source, ignore=["where"])
    assert here(4, str(data))[0] == 1.0
    b = Machine(url, options, tmp_path / "b")
    assert b.do("call", 4, str(data)) == 1.0  # fetched: a local copy on machine b
    b.stop()
    assert _calls(data) == 1
    data.write_text("2")
    here.clear()  # one function's clear
    again = Machine(url, options, tmp_path / "b")  # machine b, a new process
    assert again.do("call", 4, str(data)) == 2.0  # not its old copy
    assert again.stop() == []
    assert _calls(data) == 2
    copies = [p.name for p in (tmp_path / "b").iterdir() if p.name.startswith("g-")]
    assert len(copies) == 1  # the old generation's copies are gone


@pytest.mark.slow  # processes: a few seconds each
@pytest.mark.parametrize("how", ["function", "memory", "cli"])
def test_a_clear_reaches_a_running_process_within_revalidate_after(s3_bucket, tmp_path, data, how):
    url, options = s3_bucket
    url += "/c"
    b = Machine(url, options, tmp_path / "b", revalidate_after=0.5)
    assert b.do("call", 3, str(data)) == 1.0
    assert b.do("call", 3, str(data)) == 1.0  # a hit of its copy
    data.write_text("2")
    if how == "cli":  # the mlcache command on another machine: `mlcache clear <url> --yes`
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": options["client_kwargs"]["endpoint_url"],
            "AWS_ACCESS_KEY_ID": options["key"],
            "AWS_SECRET_ACCESS_KEY": options["secret"],
            "XDG_CACHE_HOME": str(tmp_path / "cli-home"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "mlcache", "clear", url, "--yes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    else:
        here = _memory(url, options, tmp_path / "a")
        if how == "function":
            here.cache(source, ignore=["where"]).clear()
        else:
            here.clear()
    time.sleep(0.6)  # revalidate_after has passed for machine b
    assert b.do("call", 3, str(data)) == 2.0
    assert b.stop() == []
    assert _calls(data) == 2


@pytest.mark.slow  # processes: a few seconds each
def test_a_new_empty_bucket_at_the_same_url_is_not_answered_from_old_copies(
    s3_bucket, tmp_path, data
):
    import s3fs

    url, options = s3_bucket
    b = Machine(f"{url}/c", options, tmp_path / "b", revalidate_after=0.5)
    assert b.do("call", 2, str(data)) == 1.0
    fs = s3fs.S3FileSystem(**options)
    bucket = url[len("s3://") :]
    fs.rm(bucket, recursive=True)  # the bucket is deleted...
    with contextlib.suppress(FileNotFoundError):
        fs.rmdir(bucket)
    fs.mkdir(bucket)  # ... and a new one made at the same URL
    assert fs.ls(bucket) == []
    data.write_text("2")
    started = Machine(f"{url}/c", options, tmp_path / "b")  # machine b, a new process
    assert started.do("call", 2, str(data)) == 2.0
    time.sleep(0.6)
    assert b.do("call", 2, str(data)) == 2.0  # the running one, once it looked again
    assert started.stop() == [] and b.stop() == []


@pytest.mark.slow  # processes: a few seconds each
def test_two_keys_on_one_cache_do_not_overwrite_each_other(s3_bucket, tmp_path, data):
    """Machine b has another key (its own MLCACHE_SECRET): it computes and returns
    right values, says once what to fix, and stores nothing; machine a's entries
    stay and are hits for it. A clear (the way to change a team's key) lets the
    next key be recorded."""
    url, options = s3_bucket
    url += "/c"
    a = Machine(url, options, tmp_path / "a", secret=None, env={"MLCACHE_SECRET": "alpha"})
    assert a.do("call", 5, str(data)) == 1.0
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    stored = {p: fs.info(p)["ETag"] for p in fs.find(url) if is_entry(p[len(url) + 1 :])}
    assert len(stored) == 1
    b = Machine(url, options, tmp_path / "b", secret=None, env={"MLCACHE_SECRET": "beta"})
    assert b.do("call", 5, str(data)) == 1.0
    assert b.do("call", 6, str(data)) == 1.0
    assert b.do("call", 6, str(data)) == 1.0  # computed again: nothing was stored
    assert a.do("call", 5, str(data)) == 1.0  # a's entry is still a hit
    assert _calls(data) == 4
    fs.invalidate_cache()
    after = {p: fs.info(p)["ETag"] for p in fs.find(url) if is_entry(p[len(url) + 1 :])}
    assert after == stored  # never overwritten, nothing added
    said = b.stop()
    key_warnings = [w for w in said if "signed with another key" in w and "MLCACHE_SECRET" in w]
    assert len(key_warnings) == 1 and "without being stored" in key_warnings[0], said
    assert a.stop() == []
    # the team moves to b's key: a clear forgets the recorded one
    rotated = Machine(url, options, tmp_path / "b", secret=None, env={"MLCACHE_SECRET": "beta"})
    rotated.do("clear all")
    assert rotated.do("call", 5, str(data)) == 1.0
    assert rotated.do("call", 5, str(data)) == 1.0
    assert rotated.stop() == []
    assert _calls(data) == 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_wrong_endpoint_at_construction_runs_uncached_with_one_warning(tmp_path, data):
    options = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_free_port()}"},
        **_FAST,
    }
    with pytest.warns(CacheWarning, match="cannot be reached") as said:
        mem = _memory("s3://nowhere/c", options, tmp_path / "l", revalidate_after=3600)
        f = mem.cache(source, ignore=["where"])
        assert f(3, str(data))[0] == 1.0
        assert f(3, str(data))[0] == 1.0
        # another Memory of this process on the same URL (a Memory unpickled again,
        # a notebook cell run again) knows it already: no second warning
        again = _memory("s3://nowhere/c", options, tmp_path / "l2", revalidate_after=3600)
        assert again.cache(source, ignore=["where"])(3, str(data))[0] == 1.0
    assert len([w for w in said if issubclass(w.category, CacheWarning)]) == 1
    assert _calls(data) == 3  # computed each time: nothing could be stored
    assert not mem.store.reachable and not again.store.reachable


class Proxy:
    """A TCP relay on a fixed port to the server: stopping it is the server gone
    for the client (connections refused, open ones cut); starting it again on
    the same port brings the server back."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit("//", 1)[1].split(":")
        self.target = (host, int(port))
        self.port = _free_port()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        assert self._listener is not None
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (close alone does not)
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@contextlib.contextmanager
def _proxy(endpoint: str) -> Iterator[Proxy]:
    proxy = Proxy(endpoint)
    proxy.start()
    try:
        yield proxy
    finally:
        with contextlib.suppress(Exception):
            proxy.stop()


@pytest.mark.slow  # ~3 s: waits for revalidate_after twice
def test_a_server_gone_mid_run_and_back(s3_bucket, s3_endpoint, tmp_path, data):
    """The calls keep working while it is gone (one warning), and once it answers
    again hits and stores resume."""
    url, options = s3_bucket
    with _proxy(s3_endpoint) as proxy:
        through = {**options, "client_kwargs": {"endpoint_url": proxy.url}, **_FAST}
        mem = _memory(f"{url}/c", through, tmp_path / "l", revalidate_after=0.5)
        f = mem.cache(source, ignore=["where"])
        assert f(1, str(data))[0] == 1.0
        assert f(1, str(data))[0] == 1.0  # a hit
        assert _calls(data) == 1
        proxy.stop()  # the server is gone
        with pytest.warns(CacheWarning) as said:
            time.sleep(0.6)
            assert f(1, str(data))[0] == 1.0  # computed: its copy is not served now
            assert f(2, str(data))[0] == 1.0
            assert f(2, str(data))[0] == 1.0
        cache_warnings = [str(w.message) for w in said if issubclass(w.category, CacheWarning)]
        assert len(cache_warnings) == 1 and "cannot be reached" in cache_warnings[0]
        assert _calls(data) == 4
        assert not mem.store.reachable
        proxy.start()  # back: tried again in the background, no call waits for it
        deadline = time.monotonic() + 60
        while not mem.store.reachable and time.monotonic() < deadline:
            assert mem.store.generation is None or mem.store.reachable
            time.sleep(0.1)
        assert mem.store.reachable
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            assert f(1, str(data))[0] == 1.0  # its entry, a hit again
            assert f(3, str(data))[0] == 1.0  # computed and stored
            assert f(3, str(data))[0] == 1.0
        assert _calls(data) == 5
        assert mem.store.reachable


@pytest.mark.slow  # a server of its own, started and stopped: a few seconds
def test_a_server_stopped_mid_run_leaves_the_calls_working(tmp_path, data):
    """The real server process stopped (not a relay): one warning, right values."""
    import s3fs

    from mlcache.testing import s3_options, seaweedfs

    with contextlib.ExitStack() as running:
        endpoint = running.enter_context(seaweedfs(tmp_path / "weed"))
        options = {**s3_options(endpoint), **_FAST}
        s3fs.S3FileSystem(**options).mkdir("stopped")
        mem = _memory("s3://stopped/c", options, tmp_path / "l", revalidate_after=0.5)
        f = mem.cache(source, ignore=["where"])
        assert f(1, str(data))[0] == 1.0
        assert f(1, str(data))[0] == 1.0
        assert _calls(data) == 1
    # the server has exited
    with pytest.warns(CacheWarning) as said:
        time.sleep(0.6)
        assert f(1, str(data))[0] == 1.0
        assert f(2, str(data))[0] == 1.0
        assert f(2, str(data))[0] == 1.0
    cache_warnings = [str(w.message) for w in said if issubclass(w.category, CacheWarning)]
    assert len(cache_warnings) == 1 and "cannot be reached" in cache_warnings[0]
    assert _calls(data) == 4 and not mem.store.reachable


def test_a_read_only_cache_without_a_generation_object_still_opens(tmpfs, tmp_path, data):
    """A file:// cache filled by an older mlcache (no .mlcache-generation) on a
    read-only mount: the store opens (no generation can be written) and serves
    its hits."""
    from mlcache.store.fsspec import GENERATION

    url = f"file://{tmpfs}/cache"
    f = _memory(url, {}, tmp_path / "a").cache(source, ignore=["where"])
    assert f(2, str(data))[0] == 1.0
    (tmpfs / "cache" / GENERATION).unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    reader = _memory(url, {}, tmp_path / "b").cache(source, ignore=["where"])
    assert reader(2, str(data))[0] == 1.0
    assert _calls(data) == 1  # a hit
    assert not (tmpfs / "cache" / GENERATION).exists()


def test_a_hit_of_a_local_copy_sends_no_request(tmp_path, monkeypatch):
    """Between two looks at the generation, a hit is local: no call reaches the
    file system (every one of its request methods is counted)."""
    import uuid

    from mlcache.store.fsspec import FsspecStore

    store = FsspecStore(f"memory://hits-{uuid.uuid4().hex[:8]}/c", local_cache_dir=tmp_path / "l")
    with store.write("f/v/k") as f:
        f.write(b"payload")
    calls: list[str] = []
    for method in ("cat_file", "get_file", "open", "exists", "info", "ls", "find", "pipe_file"):
        real = getattr(store.fs, method)
        monkeypatch.setattr(  # the shared memory file system: restored after
            store.fs, method, lambda *a, _m=method, _r=real, **k: calls.append(_m) or _r(*a, **k)
        )
    path = store.local_path("f/v/k")
    for _ in range(100):
        assert store.local_path("f/v/k") == path
    assert calls == []
    store.new_generation()  # a clear: the next use looks (one read) and fetches again
    assert Path(store.local_path("f/v/k")).read_bytes() == b"payload"
    assert calls.count("cat_file") == 1 and calls.count("get_file") == 1
