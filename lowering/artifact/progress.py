"""Compile progress: a status line once a compile is slow, and per-stage timings (-v)."""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

__all__ = ["Progress", "NoProgress"]


class Progress:
    """Stage timer: prints a status line to `stream` once a compile passes `after` s,
    and (verbose) a table of per-stage timings at the end."""

    def __init__(self, label: str, verbose: bool = False, stream=None, after: float = 1.0):
        self.label, self.verbose, self.after = label, verbose, after
        self.stream = stream if stream is not None else sys.stderr
        self.timings: list[tuple[str, float]] = []
        self.t0 = time.perf_counter()
        self.current = "starting"
        self._shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def _tick(self):
        last = None
        while not self._stop.wait(0.25):
            el = time.perf_counter() - self.t0
            if el < self.after:
                continue
            with self._lock:
                cur = self.current
            if cur != last or int(el) != int(el - 0.25):
                self._line(f"rlxc: compiling {self.label}: {cur} ... {el:.1f} s")
                last = cur

    def _line(self, text: str):
        tty = getattr(self.stream, "isatty", lambda: False)()
        if tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    @contextmanager
    def stage(self, name: str):
        with self._lock:
            self.current = name
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timings.append((name, time.perf_counter() - t))

    def record(self, name: str, seconds: float):
        self.timings.append((name, seconds))

    def finish(self, ok: bool = True):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        el = time.perf_counter() - self.t0
        if self._shown:
            tty = getattr(self.stream, "isatty", lambda: False)()
            end = "done" if ok else "failed"
            self.stream.write(("\r\033[K" if tty else "") +
                              f"rlxc: compiling {self.label}: {end} in {el:.2f} s\n")
        if self.verbose:
            w = max([len(n) for n, _ in self.timings] + [5])
            self.stream.write(f"rlxc: timings for {self.label} (total {el:.3f} s)\n")
            for n, s in self.timings:
                self.stream.write(f"  {n:<{w}}  {s * 1000:9.1f} ms\n")
        self.stream.flush()


class NoProgress(Progress):
    def __init__(self):
        super().__init__("", False, stream=open(os.devnull, "w"), after=1e9)
