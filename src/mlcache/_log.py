"""Where ``verbose`` messages go: the ``mlcache`` logger, or stderr when nothing
would show them.

joblib prints computed calls at ``verbose=1`` (its default); a library's logger
is silent until the application configures ``logging``. Both hold here:

- if a handler would see the ``mlcache`` logger's records (one on the logger or
  on an ancestor it propagates to, such as ``logging.basicConfig``'s on the root;
  the ``NullHandler`` mlcache adds and ``logging.lastResort`` do not count), the
  messages go through ``logging`` and its configuration decides what is shown;
- otherwise a message at ``verbose >= 1`` is written to ``sys.stderr`` (never
  stdout, which belongs to the program), one line each, unless a level set on
  the ``mlcache`` logger (``logging.getLogger("mlcache").setLevel(logging.WARNING)``)
  says not to.

Call sites write ``logger_for(self._verbose).info(...)`` where they wrote
``logger.info(...)``; they keep their own ``verbose`` checks.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

__all__ = ["logger_for", "logging_configured"]

_LOGGER = logging.getLogger("mlcache")


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test's capture,
    a redirected stream), not to the stream of when it was made."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # setStream(): stderr stays the stream
        pass


# not registered with logging's manager: no parent, no propagation, invisible to
# the application's configuration (which then never sees a record twice)
_CONSOLE = logging.Logger("mlcache")
_CONSOLE.propagate = False
_CONSOLE.addHandler(_Stderr())


def logging_configured(logger: logging.Logger = _LOGGER) -> bool:
    """True if a handler other than a ``NullHandler`` would receive ``logger``'s
    records (as :meth:`logging.Logger.hasHandlers`, which counts NullHandlers)."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def logger_for(verbose: int) -> logging.Logger:
    """The logger a message shown at verbosity ``verbose`` goes to: ``mlcache``'s
    when logging is configured (or ``verbose`` is 0), else one writing to stderr.

    Examples
    --------
    >>> logger_for(0).name
    'mlcache'
    """
    if verbose <= 0 or logging_configured():
        return _LOGGER
    _CONSOLE.setLevel(_LOGGER.level or logging.INFO)  # a level set on mlcache's logger holds
    return _CONSOLE
