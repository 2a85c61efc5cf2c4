"""Run joblib's own ``Memory`` tests with mlcache in joblib's place.

``python benchmarks/joblib_suite.py`` runs the installed joblib's
``joblib/test/test_memory.py`` and ``test_memory_async.py`` (nothing of them is
kept here: they are copied from the installed package into a temporary folder
at each run, so that the functions they define are user code, as a user's tests
are, and not a library's under site-packages) with this module loaded as a
pytest plugin. The plugin swaps mlcache's public classes
into ``joblib`` and ``joblib.memory`` before the test modules import them, so
every ``Memory``, ``MemorizedFunc``, ``register_store_backend``... the tests
use is mlcache's, while joblib's private helpers they import
(``_build_func_identifier``, ``_STORE_BACKENDS``, ...) stay joblib's. A test
that starts a Python subprocess gets the swap too (a ``sitecustomize`` on its
``PYTHONPATH``).

It then prints which tests pass, and for each failing test whether it is one
of the public-API tests (those that use only joblib's public API, see
:data:`INTERNAL`) and why it failed. Extra arguments go to pytest
(``-k lambda``, ``-x``). It needs joblib (the dev extra) and takes seconds;
it is not part of the test suite, which tests mlcache's compatibility on its
own (``tests/compat/test_joblib_api.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: tests of joblib's files that inspect joblib's private layout, its private
#: helpers, its own warning class or its exact text: not counted among the
#: public-API tests (the value is what each one inspects)
INTERNAL = {
    # joblib's folder layout, files and private helpers
    "test_parallel_call_cached_function_defined_in_jupyter": "lists <location>/joblib/<module>/f",
    "test_memory_numpy_check_mmap_mode": "corrupts output.pkl via store_backend.get_items()",
    "test_memory_numpy_check_mmap_mode_async": "corrupts output.pkl via store_backend.get_items()",
    "test_memory_recomputes_after_an_error_while_loading_results": "corrupts output.pkl",
    "test_call_and_shelve_lazily_load_stored_result": "_get_args_id, the atime of output.pkl",
    "test_persistence": "_get_args_id, store_backend.load_item and joblib's folders",
    "test_func_dir": "joblib's folders, func_code.py, _check_previous_func_code",
    "test__get_items": "store_backend.get_items() of joblib's folders",
    "test__get_items_to_delete": "store_backend._get_items_to_delete",
    "test_memory_reduce_size_bytes_limit": "_get_args_id, store_backend.get_items()",
    "test_memory_reduce_size_items_limit": "_get_args_id, store_backend.get_items()",
    "test_memory_reduce_size_age_limit": "_get_args_id, store_backend.get_items()",
    "test_memory_clear": "_get_args_id, _check_previous_func_code",
    "test_memorized_result_forwards_mmap_mode": "MemorizedResult(location, _call_id)",
    "test_warning_on_unknown_location_type": "_store_backend_factory's warning text",
    "test_instanciate_store_backend_with_pathlib_path": "_store_backend_factory's location",
    "test_filesystem_store_backend_repr": "joblib's FileSystemStoreBackend",
    "test_memory_pickle_dump_load": "compares vars() (private attributes) of the objects",
    # joblib's warning class (mlcache keys every code version apart: nothing collides)
    "test_memory_name_collision": "joblib's JobLibCollisionWarning",
    "test_memory_in_memory_function_code_change": "joblib's JobLibCollisionWarning",
    "test_memory_warning_lambda_collisions": "joblib's JobLibCollisionWarning",
    "test_memory_warning_collision_detection": "joblib's JobLibCollisionWarning",
    # joblib's exact text
    "test_memory_file_modification": "joblib's exact log text",
    "test_info_log": "joblib's exact log text ('Querying')",
    "test_memory_objects_repr": "joblib's exact repr text",
    "test_memory_creates_gitignore": "joblib's exact .gitignore text",
}

_MEMORY_NAMES = (
    "Memory",
    "MemorizedFunc",
    "AsyncMemorizedFunc",
    "MemorizedResult",
    "NotMemorizedFunc",
    "AsyncNotMemorizedFunc",
    "NotMemorizedResult",
    "expires_after",
    "register_store_backend",
)


def swap() -> None:
    """Put mlcache's public classes where joblib's are (``joblib`` and
    ``joblib.memory``), before anything imports them from there."""
    import joblib
    import joblib.memory

    import mlcache
    import mlcache.memo.func as memo_func
    import mlcache.memo.memory as memo_memory
    import mlcache.memo.results as memo_results

    ours = {
        "Memory": mlcache.Memory,
        "MemorizedFunc": mlcache.MemorizedFunc,
        "AsyncMemorizedFunc": memo_func.AsyncMemorizedFunc,
        "MemorizedResult": mlcache.MemorizedResult,
        "NotMemorizedFunc": mlcache.NotMemorizedFunc,
        "AsyncNotMemorizedFunc": memo_results.AsyncNotMemorizedFunc,
        "NotMemorizedResult": mlcache.NotMemorizedResult,
        "expires_after": memo_memory.expires_after,
        "register_store_backend": mlcache.register_store_backend,
    }
    for name in _MEMORY_NAMES:
        setattr(joblib.memory, name, ours[name])
        if hasattr(joblib, name):
            setattr(joblib, name, ours[name])
    # two private names of joblib's registry, which its backend tests read, shown
    # as mlcache's: the registered class (for a joblib backend: the class given,
    # not its adapter) and a backend made by name as a Memory makes it
    joblib.memory._STORE_BACKENDS = _RegistryView()
    joblib.memory._store_backend_factory = _make_backend


class _RegistryView(Mapping):  # type: ignore[type-arg]
    """mlcache's store registry as ``joblib.memory._STORE_BACKENDS`` reads."""

    def __getitem__(self, name: str) -> Any:
        from mlcache.store import stores

        cls = stores[name]
        return getattr(cls, "backend_class", cls)

    def __iter__(self) -> Any:
        from mlcache.store import stores

        return iter(stores)

    def __len__(self) -> int:
        from mlcache.store import stores

        return len(stores)


def _make_backend(
    backend: str, location: Any, verbose: int = 0, backend_options: Any = None
) -> Any:
    """A backend made as ``Memory(location, backend=backend)`` makes it (for a
    joblib backend: the joblib object inside its adapter)."""
    import mlcache

    store = mlcache.Memory(location, backend=backend, backend_options=backend_options).store
    return getattr(store, "backend", store)


if os.environ.get("MLCACHE_JOBLIB_SWAP") == "1":
    swap()  # loaded as a plugin (or by a subprocess's sitecustomize)


# -- the pytest plugin ------------------------------------------------------------------
def pytest_configure(config: Any) -> None:
    # joblib's own conftest (not installed) declares these markers
    for marker in ("asyncio", "thread_unsafe", "no_cover"):
        config.addinivalue_line("markers", f"{marker}: declared for joblib's tests")


def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    """Run ``async def`` tests in a new event loop (joblib uses pytest-asyncio,
    which the dev extra does not have)."""
    func = pyfuncitem.obj
    if not inspect.iscoroutinefunction(func):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(func(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


# -- the script -------------------------------------------------------------------------
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+?)(?: - (.*))?$")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest")
    args = parser.parse_args(argv)
    import joblib

    tests = Path(joblib.__file__).parent / "test"
    here = Path(__file__).resolve().parent
    src = here.parent / "src"
    with tempfile.TemporaryDirectory(prefix="mlcache-joblib-suite-") as site:
        # a subprocess a test starts swaps too
        Path(site, "sitecustomize.py").write_text("import joblib_suite\n")
        # the test files run from this temporary folder, not from site-packages: a
        # user's tests and the functions they define are user code, while code under
        # site-packages is a library's (mlcache walks and learns user code only)
        for name in ("test_memory.py", "test_memory_async.py"):
            text = (tests / name).read_text()
            text = text.replace("from .test_memory import", "from test_memory import")
            Path(site, name).write_text(text)
        env = dict(os.environ, MLCACHE_JOBLIB_SWAP="1")
        path = [site, str(here), str(src), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            os.devnull,
            "--rootdir",
            site,  # results are named test_memory.py::test_...
            "-p",
            "joblib_suite",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "-W",
            "ignore::pytest.PytestAssertRewriteWarning",  # this module, loaded twice
            "--tb=line",
            str(Path(site, "test_memory.py")),
            str(Path(site, "test_memory_async.py")),
            *args.pytest_args,
        ]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=site)
    outcomes: dict[str, list[tuple[str, str]]] = {}
    files: dict[str, str] = {}
    for line in res.stdout.splitlines():
        m = _RESULT.match(line)
        if m:
            test = m.group(2).split("::")[-1].split("[")[0]
            files[test] = m.group(2).split("::")[0].rsplit("/", 1)[-1]
            outcomes.setdefault(test, []).append((m.group(1), m.group(3) or ""))
    if not outcomes:
        print(res.stdout[-5000:], res.stderr[-5000:])
        return 2
    public = {t: o for t, o in outcomes.items() if t not in INTERNAL}
    ok = [t for t, o in public.items() if all(s in ("PASSED", "SKIPPED") for s, _ in o)]
    for name in sorted(set(files.values())):
        mine = [t for t in outcomes if files[t] == name]
        pub = [t for t in mine if t in public]
        print(
            f"{name}: {len(mine)} tests, {len(pub)} public-API, "
            f"{sum(t in ok for t in pub)} of them pass"
        )
    print(f"public-API tests passing: {len(ok)} of {len(public)}")
    for test, results in sorted(outcomes.items()):
        bad = [(s, why) for s, why in results if s in ("FAILED", "ERROR")]
        if bad:
            kind = f"internal: {INTERNAL[test]}" if test in INTERNAL else "PUBLIC"
            print(f"  {test} ({kind}): {len(bad)}/{len(results)} failed")
            for s, why in bad[:3]:
                print(f"      {s}: {why[:200]}")
    print(res.stdout.splitlines()[-1] if res.stdout else res.stderr[-2000:])
    return 0 if len(ok) == len(public) else 1


if __name__ == "__main__":
    sys.exit(main())
