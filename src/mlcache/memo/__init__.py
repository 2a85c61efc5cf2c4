"""The function cache: :class:`~mlcache.Memory` and what it memoizes.

Inside the package, imports point down::

    memory        Memory (joblib's API), the default cache; builds the context
      |
    parallel      cached_map: a memoized function over many items
      |
    func          MemorizedFunc: the call, the hit path, exceptions -> misses
      |
    versions      code versions side by side, old-version cleanup
      |
    learning      what calls change: bookkeeping learned per function and version
    locking       one computation per key (one lock loop, sync and async)
    results       MemorizedResult, shelved results
      |
    context       MemoContext: what a Memory resolves once (store and its powers,
      |           signer, pickle policy, compression, usage, size guard)
    eviction      size limits (least recently used first)
    usage         last-use times and hit/miss statistics, off the hot path
    layout        how entries are named inside a store
    config        MemoryConfig: the constructor's settings, validated

The public names are re-exported by :mod:`mlcache`.
"""
