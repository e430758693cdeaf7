"""Logging: one configuration for the server and uvicorn, text or JSON lines, and GraphQL errors
logged by whose mistake they are.

A client's mistake (a denied write, a wrong type, a query that does not validate) is reported to
that client and logged at INFO on one line; only a fault of the server gets a traceback. strawberry
logs every GraphQL error at ERROR with a traceback (25 lines for a denied put), which buried real
faults under users' typos.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import strawberry
from graphql import GraphQLError

from .errors import PvwireError

__all__ = ["FORMATS", "JsonFormatter", "LoggingSchema", "log_graphql_errors", "logging_config"]

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

log = logging.getLogger("pvwire.graphql")

# Attributes every LogRecord has; anything else on a record came from `extra=` and is data.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of the message with terminal colours
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, extra fields, and
    the traceback as one string field when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def _iso_time(created: float) -> str:
    millis = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` dict: the root logger writes to stderr in the chosen format
    and uvicorn's loggers pass through it. Given to uvicorn as `log_config` as well, so that each
    worker process (`--workers N`, started afresh) configures itself the same way."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    formatter: dict[str, Any] = (
        {"()": "pvwire.logs.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    passthrough = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"pvwire": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "pvwire",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": passthrough,
            "uvicorn.error": passthrough,
            "uvicorn.access": passthrough,
        },
    }


def is_client_error(error: GraphQLError) -> bool:
    """Did the request cause this error (bad query, denied write, wrong value), not the server?"""
    original = error.original_error
    # No original exception: parse and validation errors, and the request limits' own errors.
    # A GraphQLError raised by a resolver is a deliberate answer (it carries a code); so is a
    # PvwireError. Anything else escaping a resolver is a fault of the server.
    return original is None or isinstance(original, GraphQLError | PvwireError)


def log_graphql_errors(errors: list[GraphQLError]) -> None:
    for error in errors:
        path = ".".join(str(p) for p in error.path or ())
        if is_client_error(error):
            code = (error.extensions or {}).get("code") or (
                error.original_error.code
                if isinstance(error.original_error, PvwireError)
                else "GRAPHQL_VALIDATION"
            )
            message = " ".join(error.message.split())  # one line, whatever the message holds
            log.info(
                "request error %s%s: %s",
                code,
                f" at {path}" if path else "",
                message,
                extra={"code": code, "path": path},
            )
        else:
            log.error(
                "server fault%s: %s",
                f" at {path}" if path else "",
                error.message,
                exc_info=error.original_error,
                extra={"code": "INTERNAL", "path": path},
            )


class LoggingSchema(strawberry.Schema):
    """strawberry's Schema, logging errors with `log_graphql_errors` instead of all as faults."""

    def process_errors(self, errors: list[GraphQLError], execution_context: Any = None) -> None:
        log_graphql_errors(errors)
