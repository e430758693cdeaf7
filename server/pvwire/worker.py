"""Which process this is: an operator reading /metrics or the GraphQL `server` query behind one
port served by `--workers N` (or a replica behind a load balancer) needs to know who answered."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass

__all__ = ["WorkerIdentity"]


@dataclass(frozen=True)
class WorkerIdentity:
    instance: str  # the `instance` setting: the host name unless configured
    pid: int
    # 1..N under `--workers N`, 0 for a lone process. uvicorn's supervisor starts its workers as
    # spawned processes named SpawnProcess-<n>, n counting up from 1 in start order; a worker
    # that died and was replaced gets the next number, so a number is never reused.
    worker: int
    workers: int

    @classmethod
    def current(cls, instance: str, workers: int = 1) -> WorkerIdentity:
        name = multiprocessing.current_process().name
        _, _, number = name.rpartition("-")
        worker = int(number) if workers > 1 and number.isdigit() else 0
        return cls(instance, os.getpid(), worker, workers)
