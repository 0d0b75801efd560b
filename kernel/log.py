"""Structured logs: one JSON object per line (or console lines), each with the actor's name."""

import logging
import sys

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(actor: str, log_format: str = "json", level: str = "info") -> structlog.stdlib.BoundLogger:
    renderer = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if log_format == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(actor=actor)
    return structlog.get_logger()
