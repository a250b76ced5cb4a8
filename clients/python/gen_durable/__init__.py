"""gen_durable from Python: the API (Client, AsyncClient), external workers
(Worker, AsyncWorker) and the outcomes steps return.  See README.md."""

from ._core import Context, Instance, Settled
from .aio import AsyncClient, AsyncWorker
from .client import Client, connect
from .outcomes import Outcome, done, next_step, retry, spawn, stop, wait_signal
from .worker import Worker, run_workers

__all__ = ["AsyncClient", "AsyncWorker", "Client", "Context", "Instance", "Outcome", "Settled", "Worker",
           "connect", "done", "next_step", "retry", "run_workers", "spawn", "stop", "wait_signal"]
__version__ = "0.2.0"
