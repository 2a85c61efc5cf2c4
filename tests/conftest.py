"""Test-session setup: a private signing key and default cache folder for the whole run.

Every ``Memory`` signs entries with the per-user key by default; the tests (and
the processes they start, which inherit the environment) use a key file of
their own instead of creating one in the home folder of whoever runs them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_key_file():
    with tempfile.TemporaryDirectory(prefix="mlcache-test-key-") as folder:
        names = ("MLCACHE_KEY_FILE", "MLCACHE_SECRET", "MLCACHE_DIR")
        saved = {k: os.environ.get(k) for k in names}
        os.environ["MLCACHE_KEY_FILE"] = os.path.join(folder, "key")
        os.environ.pop("MLCACHE_SECRET", None)
        # what a test leaves in the default cache folder (the local copies of a remote
        # pack, a dataset without cache_dir) never lands in the user's own
        os.environ["MLCACHE_DIR"] = os.path.join(folder, "default-cache")
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- a real S3 server (SeaweedFS), started once per session by the tests that ask -------
@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """The URL of a SeaweedFS S3 server on 127.0.0.1 (see mlcache.testing). Fails,
    never skips, when it cannot be started."""
    from mlcache.testing import ServerError, seaweedfs

    try:
        with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as url:
            yield url
    except ServerError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh bucket's URL and the options to reach it."""
    import uuid

    import s3fs

    from mlcache.testing import s3_options

    options = s3_options(s3_endpoint)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    return f"s3://{bucket}", options


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs of our own, that a test may remount read-only (we are root:
    a read-only mount, not chmod, is what refuses root's writes); unmounted after."""
    where = tmp_path / "mount"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs("2m")``: a tmpfs of that size mounted for the test (a real
    disk that fills up), unmounted after; the test is skipped where mounting is
    impossible (not root)."""
    mounted = []

    def mount(size: str, name: str = "disk"):
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)
