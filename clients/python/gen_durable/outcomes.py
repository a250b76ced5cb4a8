"""Outcomes: what a step returns, as in SQL (gd_next, gd_retry, ...).

Each is the JSON form gd_outcome(jsonb) turns into a gd.outcome inside the
database, so a step run here ends exactly as an in-database step would.
Durations are seconds (int or float) or datetime.timedelta.
"""

import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

Seconds = Union[int, float, datetime.timedelta]
Json = Any


class Outcome(dict):
    """A step's outcome in its JSON form (a dict): {"kind": ..., arguments...}."""

    @property
    def kind(self) -> str:
        return self["kind"]


def interval(value: Optional[Seconds]) -> Optional[str]:
    """A duration as PostgreSQL interval text."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    return f"{seconds} seconds"


def _outcome(kind: str, **arguments) -> Outcome:
    return Outcome(kind=kind, **{name: value for name, value in arguments.items() if value is not None})


def next_step(step: str, state: Optional[Mapping] = None, delay: Optional[Seconds] = None) -> Outcome:
    """Go on at `step` (with a new `state`, else the same), now or after `delay`."""
    return _outcome("next", step=step, state=state, delay=interval(delay))


def retry(error: Optional[Json] = None, backoff: Optional[Seconds] = None) -> Outcome:
    """A failed attempt: the step runs again after `backoff` (default: the step's), or the instance fails."""
    return _outcome("retry", error=error if error is not None else {}, backoff=interval(backoff))


def wait_signal(names: Iterable[str], timeout: Optional[Seconds] = None, then_step: Optional[str] = None,
                state: Optional[Mapping] = None) -> Outcome:
    """Park until a signal of one of `names` arrives (or `timeout` passes), then go on at `then_step`."""
    return _outcome("wait_signal", names=list(names), timeout=interval(timeout), then_step=then_step, state=state)


def spawn(children: Sequence[Mapping], then_step: str, state: Optional[Mapping] = None) -> Outcome:
    """Start child instances (insert option objects) and go on at `then_step` once all have ended."""
    return _outcome("spawn", children=list(children), then_step=then_step, state=state)


def done(result: Optional[Json] = None) -> Outcome:
    """End the instance with `result`."""
    return _outcome("done", result=result if result is not None else {})


def stop(error: Optional[Json] = None) -> Outcome:
    """Fail the instance now, without a retry."""
    return _outcome("stop", error=error if error is not None else {})
