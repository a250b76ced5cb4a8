"""The overview's charts: a sampler reads the counters every few seconds
(as the dashboard's role: the steps and queues it sees), keeps the last
minutes in memory, and draws them as small inline SVG lines."""

import collections
import logging
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import data

log = logging.getLogger("gd_web")

SAMPLE_SECONDS = 2.0
WINDOW_SECONDS = 10.0     # each point of a chart: the last 10 s before it
KEPT_SECONDS = 300.0      # five minutes


class Sample:
    def __init__(self, at: float, steps: int, histogram: List[int], runnable: Dict[str, int]):
        self.at, self.steps, self.histogram, self.runnable = at, steps, histogram, runnable


class Sampler:
    def __init__(self, pool, read_queues, interval: float = SAMPLE_SECONDS):
        self.pool, self.read_queues, self.interval = pool, read_queues, interval
        self.samples = collections.deque(maxlen=int(KEPT_SECONDS / interval) + 1)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def start(self):
        self.thread = threading.Thread(target=self._run, name="gd_web sampler", daemon=True)
        self.thread.start()

    def stop(self):
        self.stopping.set()
        if self.thread:
            self.thread.join(timeout=5)

    def _run(self):
        while not self.stopping.is_set():
            try:
                self.sample()
            except Exception as error:  # the database may be down for a while: keep trying
                log.warning("gd_web: sampling the counters failed: %s", error)
            self.stopping.wait(self.interval)

    def sample(self):
        with self.pool.connection() as conn:
            steps = data.step_stats(conn)
            queues = self.read_queues(conn)
        histogram = [0] * 128
        for row in steps:
            for bucket, count in enumerate(row["latency_histogram"] or ()):
                histogram[bucket] += count
        taken = Sample(time.monotonic(), sum(r["count"] for r in steps), histogram,
                       {q["queue"]: q["runnable"] for q in queues})
        with self.lock:
            if self.samples and taken.steps < self.samples[-1].steps:
                self.samples.clear()  # the counters were reset
            self.samples.append(taken)

    def series(self) -> Dict[str, List[Tuple[float, Optional[float]]]]:
        """Per point (seconds before now, value): steps/s, p50 and p99 ms over the window before it."""
        with self.lock:
            samples = list(self.samples)
        now = time.monotonic()
        throughput, p50, p99 = [], [], []
        for i, current in enumerate(samples):
            first = next((s for s in samples[:i] if current.at - s.at <= WINDOW_SECONDS + 0.5), None)
            if first is None or current.at <= first.at:
                continue
            ago = now - current.at
            delta = [a - b for a, b in zip(current.histogram, first.histogram)]
            throughput.append((ago, (current.steps - first.steps) / (current.at - first.at)))
            p50.append((ago, data.quantile_ms(delta, 0.50)))
            p99.append((ago, data.quantile_ms(delta, 0.99)))
        return {"throughput": throughput, "p50": p50, "p99": p99}

    def backlog(self, queue: str) -> List[Tuple[float, Optional[float]]]:
        with self.lock:
            samples = list(self.samples)
        now = time.monotonic()
        return [(now - s.at, float(s.runnable[queue])) for s in samples if queue in s.runnable]


def sparkline(points: Sequence[Tuple[float, Optional[float]]], width: int = 240, height: int = 40) -> str:
    """An SVG polyline of (seconds ago, value) over the kept minutes, newest right; '' without points."""
    known = [(ago, value) for ago, value in points if value is not None]
    if not known:
        return ""
    top = max(value for _, value in known) or 1.0
    coordinates = " ".join(f"{width * (1 - ago / KEPT_SECONDS):.1f},{height - 2 - (height - 4) * value / top:.1f}"
                           for ago, value in known)
    return (f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
            f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{coordinates}"/></svg>')
