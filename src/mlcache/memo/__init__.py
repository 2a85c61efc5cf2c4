"""mlcache.memo."""
