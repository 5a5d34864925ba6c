"""Structured, quiet-by-default logging: ``time level logger event key=value ...``."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        line = f"{self.formatTime(record, '%H:%M:%S')}.{int(record.msecs):03d} {record.levelname.lower():5} {record.name}: {record.getMessage()}{extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


OURS = ("echo_node", "echo_learner", "bootstrap", "protocol")


class _ThirdPartyFilter(logging.Filter):
    """Third-party records pass only at CRITICAL (WARNING with ``-v``).

    py-libp2p logs ERROR for routine events (a dial to a peer that left), so
    by default our own logs say what matters.
    It is a handler filter because some py-libp2p modules force their own logger
    to INFO on import, which per-logger levels set earlier cannot undo.
    """

    def __init__(self, verbose: bool):
        super().__init__()
        self.floor = logging.WARNING if verbose else logging.CRITICAL

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] in OURS:
            return True
        # py-libp2p's DHT logs an error-looking line for every normally closed
        # stream (../shared/notes/libp2p.md, pitfall 7).
        if record.name.startswith("libp2p.kad_dht") and record.levelno < logging.CRITICAL:
            return False
        return record.levelno >= self.floor


def setup(verbose: bool) -> None:
    """DEBUG for our own loggers with ``-v``, WARNING otherwise; third parties stay quiet."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    handler.addFilter(_ThirdPartyFilter(verbose))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for ours in OURS:
        logging.getLogger(ours).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # transformers logs through a handler of its own (deprecation notices
    # from inside generate), at the level this variable sets on its import.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning" if verbose else "error")
    if not verbose:
        # Deprecation notices from inside transformers and PEFT (wrapping a
        # model for LoRA prints one): nothing an operator can act on.
        warnings.simplefilter("ignore", FutureWarning)
    # ``import libp2p`` stops its records reaching the root handler (pitfall 12).
    import libp2p  # noqa: F401

    logging.getLogger("libp2p").propagate = True


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with key=value fields."""
    logger.log(level, msg, extra={"fields": fields})
