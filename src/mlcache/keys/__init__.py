"""mlcache.keys."""
