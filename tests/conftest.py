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
