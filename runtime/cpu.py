"""ctypes loader for rlxc CPU libraries (NumPy and the standard library only).

    libNAME.so + metadata dict (CompiledArtifact.metadata(), or the cache's JSON)
          │ CpuLibrary: dlopen, bind rlx_NAME / rlx_NAME_workspace_size,
          │             rlxc_set_num_threads(RLXC_NUM_THREADS)
          ▼
    CpuCaller(lib, params=None).call(inputs[, params]) -> outputs
          per Python thread, created once: a CallFrame (runtime/call.py, the one
          native call path): ctypes pointer arrays for inputs, outputs and
          params, and a 64-byte aligned workspace
          per call: write the data pointers, get the outputs, CallFrame.invoke

Contract.  Arrays handed to `call` must already be C-contiguous with the
declared dtype and element count (`runtime.signature.coerce` makes them so;
it copies only when the array is not already like that), so no data is copied.
A returned array is never overwritten by a later call while anything still
references it.  Outputs are fresh arrays, except that a large one (at least
REUSE_MIN_BYTES) whose previous array nobody references any more (its only
caller dropped it and every view of it, so the array object is gone and any
weak reference to it was cleared) is written again in place: fresh memory of that size usually comes from mmap,
and the kernel's zero-filling page faults cost about as much as writing the
data (RLXC_REUSE_OUTPUTS=0 turns this off).  The foreign call releases the GIL.

Threads per call (ThreadGovernor).  RLXC_NUM_THREADS (or set_num_threads) is
the most threads a call may use.  When the machine's cores are shared with
other busy processes, a fork/join team of 2+ threads collapses: every
barrier waits for a descheduled thread (measured on a 2-core VM with two
other CPU-bound processes: 80-250 ms instead of 1-3 ms per call).  So each
library times its calls and keeps choosing between one thread and the
maximum: it takes the team up when its median (of its last WINDOW calls)
is below PREFER_TEAM of one thread's, keeps it while it stays below
KEEP_TEAM (a band: a team winning narrowly is not dropped and re-taken on
every swing of a noisy machine), and re-tries the other count after
EXPLORE calls (the team in short
bursts, judged warm), then twice as long after each re-try the other count
loses, up to 16x when it lost badly, so it follows the load as it changes; a
verdict against a count whose fastest quarter of calls would win came from
other processes' bursts and is re-checked every EXPLORE calls.  A team that
wins clearly (CLEAR_WIN) is re-tried against one thread only when one of its
warm calls is as slow as one thread's median (a load that collapses teams shows
there first), else every 16 * EXPLORE calls.  A narrow verdict not yet re-checked
(the first one, taken on two calls per count) is re-checked after 2 * TEAM_BURST
calls, and a re-try burst whose calls all beat the current count takes the lead at
once with a fresh window (its older calls came from other conditions).  Results do not
depend on the choice (split reductions have a fixed chunk count).  A library
whose kernels never fork is not governed.  While the team wins clearly and nothing
looks wrong, only 1 call in STEADY_SAMPLE is recorded (and every call as slow as one
thread's median): the bookkeeping is Python that runs right after the kernels.
RLXC_ADAPTIVE_THREADS=0 always uses the maximum.

Thread safety: every Python thread gets its own pointer arrays and its own
workspace (threading.local), so concurrent calls of one library from several
threads do not share mutable state and run in parallel; no lock is taken on
the call path.  A bound caller (`params=` given) writes the param pointers
into each thread's array once, when that thread first calls.

Errors: a non-zero return code is looked up in the metadata's `errors` table
(e.g. {"1": ["IndexError", "rlx.gather: index out of range [0, 5) along axis
0"]}) and raised as that exception; unknown codes raise RlxError.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from weakref import getweakrefcount as _weakrefs

import numpy as np

from .call import CallFrame, checked_array, data_address
from .errors import ArtifactError, RlxError
from .prepack import check_spec, pack_weight

NP_DTYPES = {"f32": np.float32, "f64": np.float64, "i1": np.bool_, "i32": np.int32,
             "i64": np.int64, "u32": np.uint32}
_EXC = {"IndexError": IndexError, "ValueError": ValueError, "RuntimeError": RuntimeError}
ABI = 1


_addr = data_address


REUSE_MIN_BYTES = 1 << 20
EXPLORE = 16      # a governed call re-tries the other thread count every EXPLORE calls,
                  # doubling after each re-try it loses (up to EXPLORE * 16)
WINDOW = 11       # call times remembered per thread count (their median decides)
PREFER_TEAM = 0.85  # one thread gives way to the team when the team's median is below
                    # this fraction of one thread's ...
KEEP_TEAM = 1.0     # ... and the team keeps running while its median stays below this one
                    # (a band, so that a team winning by 0-15% is not dropped and re-taken
                    # on every swing of a noisy machine: each change back costs a cold team)
CLEAR_WIN = 1.5   # a team this much faster than one thread is re-tried against it only
                  # when a warm team call is as slow as one thread's median (else every
                  # EXPLORE * 16 calls): each blind re-try costs a whole one-thread call
TEAM_BURST = 3    # consecutive calls when the team is tried (the first one warms it up)
BURST_WIN = 2     # recorded calls of a re-try burst that, all beating the current count by
                  # its bar, hand the other count the lead at once (ThreadGovernor._burst_wins)
IDLE_COLD = 2e-3  # a call this long after the previous one ended finds threads and caches cold
STEADY_SAMPLE = 16  # while the team wins clearly and shows nothing wrong (the re-tries spaced
                    # EXPLORE * 16 apart), 1 call in STEADY_SAMPLE is recorded, and every
                    # call as slow as one thread's median: the bookkeeping runs right after
                    # the kernels have filled the caches, where it took 10-45 us a call
                    # (W3 on SPR: 2-4% of the call)


def _offending_index(lib, frame, kind: str, index: int, bound: int) -> str:
    """": 5 at position (1,) of input 'y'" for the first index outside [0, bound) of the
    argument the failed check read ("" when it cannot be read back)."""
    try:
        specs, table = (lib.inputs, frame.ins) if kind == "input" else (lib.params, frame.pars)
        spec, ptr = specs[index], table[index]
        dt = np.dtype(NP_DTYPES[spec["dtype"]])
        n = 1
        for d in spec["shape"]:
            n *= int(d)
        if not ptr or n == 0:
            return ""
        a = np.frombuffer((ctypes.c_char * (n * dt.itemsize)).from_address(ptr), dt)
        a = a.reshape(tuple(spec["shape"]))
        bad = np.argwhere((a < 0) | (a >= bound))
        if not len(bad):
            return ""
        pos = tuple(int(i) for i in bad[0])
        return f": {int(a[pos])} at position {pos} of {kind} {spec['name']!r}"
    except (IndexError, KeyError, TypeError, ValueError):  # pragma: no cover - best effort
        return ""


def _env_flag(name: str, default: bool = True) -> bool:
    v = os.environ.get(name, "").strip().lower()
    return default if not v else v not in ("0", "false", "no", "off")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        return os.cpu_count() or 1


class ThreadGovernor:
    """Chooses, per call, between one thread and the library's maximum (see the header).

    `begin()` returns the timing token of a call (its thread count, start time and
    whether it starts cold, after setting the library's count when it changes);
    `end(token)` records how long the call took and re-decides.  Cheap on the call
    path: a counter, a compare and two perf_counter reads; the medians are recomputed
    only in `end`, after every 4th recorded call.  In the steady state (the team wins
    clearly, nothing wrong seen) `end` records 1 call in STEADY_SAMPLE and every call as
    slow as one thread's median (`alarm`): right after a large kernel the caches hold its
    data, and the bookkeeping cost 10-45 us a call there (W3 on SPR).

    The team is judged warm: a team call right after a one-thread call finds the
    team's threads asleep (they stop spinning soon after a region) and pays their
    wake-up, which says nothing about running with the team, so it is not recorded;
    the team is therefore tried in bursts of TEAM_BURST calls.  Likewise a call that
    starts more than IDLE_COLD after the previous one ended (the caller paused: the
    team's threads went to sleep, other processes took the caches) is recorded as cold,
    and a median is taken over the warm calls of its window when there are two: a
    caller that pauses between bursts is judged by its bursts, one that always pauses
    by its cold calls.

    Thread safety without a lock: several Python threads may call one library at once,
    so `begin`/`end` run concurrently.  Each call-time window is an immutable tuple
    that `end` replaces whole (one reference store: readers see the old or the new
    tuple, never one being changed), `configure` replaces the whole window table, and
    every other field is a single value that one store replaces.  A race can lose a
    sample or a counter increment, or run a call with another call's thread count;
    that only affects which count is chosen, never a result (split reductions have a
    fixed chunk count)."""

    __slots__ = ("_set", "nmax", "_cell", "calls", "hist", "seen", "adaptive", "_fixed",
                 "best", "other", "every", "lost", "ready", "ones", "prev", "last_end", "cold",
                 "burst", "alarm")

    def __init__(self, setter, n: int, parallel: bool = True, cell: list | None = None):
        """`setter(n)` sets the library's thread count; `cell` ([count last set]) is shared
        by the governors of one library (GovernorTable), so that each knows what the
        library runs with whichever governor set it."""
        self._set = setter
        self.adaptive = _env_flag("RLXC_ADAPTIVE_THREADS") and parallel
        self._cell = [None] if cell is None else cell
        self.configure(n)

    def configure(self, n: int) -> None:
        """Maximum threads `n` (0 = all cores); resets what was learned."""
        n = int(n)
        self._fixed = True  # while the fields below change, calls just use the maximum
        self.nmax = n
        self.calls = self.ones = 0  # governed calls, and how many of them ran on one thread
        self.seen = frozenset()
        # (team size, {count: tuple of its last WINDOW (time, cold) entries}), replaced whole
        self.hist = (n, {1: (), n: ()})
        self.best, self.other, self.every = n, 1, EXPLORE
        self.lost = 0  # re-tries of `other` since `best` last changed (each one it lost)
        self.ready = False
        self.prev = None
        self.last_end = None
        self.cold = False
        self.burst = ()  # (time, cold) entries of the current re-try burst of `other`
        self.alarm = 0.0  # > 0 in the steady state: a team call this slow is recorded
        self._apply(n)
        self._fixed = (not self.adaptive or self._set is None or n == 1 or
                       (n == 0 and usable_cores() <= 1))

    def _apply(self, n: int) -> None:
        if n != self._cell[0]:
            self._cell[0] = n
            if self._set is not None:
                self._set(n)

    def begin(self):
        if self._fixed:
            n = self.nmax
        else:
            c = self.calls
            self.calls = c + 1
            if not self.ready:  # learn: a few calls on one thread, then a burst with the team
                n = 1 if c % (3 + TEAM_BURST) < 3 else self.nmax
            else:
                burst = TEAM_BURST if self.other != 1 else 1
                every = self.every
                k = c % every
                n = self.other if k >= every - burst else self.best
                if k == every - 1:
                    self.lost += 1  # a re-try ends; `end` resets this if it wins
            if n == 1:
                self.ones += 1
            if n != self._cell[0]:
                self._apply(n)
        now = time.perf_counter()
        last = self.last_end
        self.cold = cold = last is not None and now - last > IDLE_COLD
        return n, now, cold

    def end(self, token) -> None:
        n, t0, cold = token
        self.last_end = now = time.perf_counter()
        dt = now - t0
        if self._fixed:
            return
        prev, self.prev = self.prev, n
        if dt < self.alarm and n == self.best and self.calls % STEADY_SAMPLE:
            return  # the steady state (STEADY_SAMPLE): an unremarkable call is not recorded
        nmax, hist = self.hist  # one snapshot: configure may replace it meanwhile
        h = hist.get(n)
        if h is None:
            return
        if n not in self.seen:  # the first call at a count pays one-time costs
            self.seen = self.seen | {n}
            return
        if n != 1 and prev == 1:
            return  # a cold team (see the class doc)
        h += ((dt, cold),)
        hist[n] = h = h[1:] if len(h) > WINDOW else h
        if self.ready and n == self.best:
            self.burst = ()
            if self.calls % 4:
                return  # re-decide after every 4th call of the current choice (sorting costs)
        elif self.ready and n == self.other and self._burst_wins(n, (dt, cold), hist):
            return
        one, many = hist[1], hist[nmax]
        if len(one) < 2 or len(many) < 2:
            return
        t1, tn = _median(one), _median(many)
        # a team must win clearly to be taken up (the first verdict included): on a busy
        # machine a team call can cost 10x a one-thread call, a one-thread call at most
        # the team's speed-up; the team in use must only keep winning to stay (the band
        # between PREFER_TEAM and KEEP_TEAM)
        bar = KEEP_TEAM if self.ready and self.best != 1 else PREFER_TEAM
        self.ready = True
        if tn < bar * t1:
            best, ratio = nmax, t1 / tn
        else:
            best, ratio = 1, tn / t1
        bar = KEEP_TEAM if best != 1 else PREFER_TEAM   # what the other count must beat
        if best != self.best:
            self.lost = 0
        # re-try the other count regularly: after EXPLORE calls, then twice as long after
        # each re-try it loses, up to a cap that grows with how badly it lost.  A first
        # verdict rests on few calls, and other processes' bursts (a peer library's
        # spinning threads, a compile) can stall a third of a team's calls for a while:
        # such a verdict must be re-checked soon, a confirmed one rarely.  When the other
        # count's latest time would win, soon again (until its median flips or it loses).
        last1, lastn = one[-1][0], many[-1][0]
        alarm = 0.0
        if (lastn < bar * t1) if best == 1 else (tn >= bar * last1):
            every = 2 * TEAM_BURST
        elif self.lost == 0 and ratio < CLEAR_WIN:
            # a narrow verdict not yet re-checked: the first one rests on two calls per
            # count taken right after the library was built, a later one on a window that
            # spans other conditions
            every = 2 * TEAM_BURST
        else:
            # a loser whose fastest quarter of calls would win lost to stalls (other
            # processes' bursts), not to its own speed: re-tried every EXPLORE calls
            won_quarter = ((_median(many, 0.25) < bar * t1) if best == 1 else
                           (tn >= bar * _median(one, 0.25)))
            cap = 0 if won_quarter or ratio < CLEAR_WIN else 2 if ratio < 4 else 4
            every = EXPLORE << min(self.lost, cap)
            warm = [t for t, cold in many[-3:] if not cold]
            if best != 1 and cap and warm and warm[-1] < t1:
                # the team wins clearly and its latest warm call shows nothing wrong (a
                # cold one, after a pause, says nothing about the load): a load that
                # collapses teams shows in the team's own warm calls first (one as slow
                # as one thread's median), which brings the re-tries back.  Blind
                # re-tries every EXPLORE-64 calls cost W3 (the team 2x faster, 68 calls
                # in compare.py) a one-thread call in 3 of its 20 samples.
                every = EXPLORE << 4
                alarm = t1
        self.every, self.alarm = every, alarm
        self.best, self.other = best, (1 if best != 1 else nmax)

    def _burst_wins(self, n: int, entry, hist: dict) -> bool:
        """Record `entry` in the current re-try burst of `n` (the other count); when the
        burst holds BURST_WIN calls and every one of them beats the current count's median
        by the bar it must clear, `n` takes over and its window restarts from the burst.

        Older entries of `n` came from other conditions (a first verdict taken while the
        machine was busier, a stretch of other processes' bursts): kept, they
        out-vote a burst that wins now (seen in compare.py's W9 on Zen 4: two 4.8 ms
        team calls from the learning calls held the team off while its re-tries took
        2.6-2.9 ms against one thread's 4.3 ms: 52-75% of the calls on one thread)."""
        self.burst = burst = (self.burst + (entry,))[-WINDOW:]
        if len(burst) < BURST_WIN:
            return False
        best = self.best
        tb = _median(hist[best])
        if n == 1:
            won = all(KEEP_TEAM * t <= tb for t, _ in burst)
        else:
            won = all(t < PREFER_TEAM * tb for t, _ in burst)
        if not won:
            return False
        hist[n] = burst[-WINDOW:]
        self.burst = ()
        self.lost = 0
        self.alarm = 0.0
        self.best, self.other, self.every = n, best, EXPLORE
        return True


class GovernorTable:
    """The ThreadGovernors of a size-generic library (runtime/dyncpu.py), one per size
    class: batch 1 and batch 64 of one library want different thread counts, and one
    governor fed both would judge each by a median of the other's call times.  A call's
    class is the bit length of the product of its sizes (classes are 2x apart); its
    governor is made on the first call of the class and kept, so a call plan can hold it.
    The governors share the library's setter and the record of the count last set."""

    __slots__ = ("_set", "nmax", "parallel", "adaptive", "_cell", "_by")

    def __init__(self, setter, n: int, parallel: bool = True):
        self._set, self.parallel, self._cell = setter, parallel, [None]
        self.adaptive = _env_flag("RLXC_ADAPTIVE_THREADS") and parallel   # as each governor's
        self._by: dict = {}
        self.configure(n)

    def configure(self, n: int) -> None:
        """Maximum threads `n` (0 = all cores) for every class; resets what was learned."""
        self.nmax = int(n)
        self._cell[0] = None
        if self._set is not None:   # applied now, as a lone ThreadGovernor does
            self._set(self.nmax)
        self._cell[0] = self.nmax   # so the governors below need not set it again
        for g in list(self._by.values()):
            g.configure(self.nmax)

    def for_sizes(self, sizes) -> ThreadGovernor:
        """The governor of the class of a call at `sizes` (the values of its symbols)."""
        work = 1
        for v in sizes:
            work *= max(1, int(v))
        cls = work.bit_length()
        g = self._by.get(cls)
        if g is None:
            g = ThreadGovernor(self._set, self.nmax, self.parallel, self._cell)
            g = self._by.setdefault(cls, g)
        return g


def _median(d, q: float = 0.5) -> float:
    """Median (or the q-quantile) call time of a window of (time, cold) entries: of its
    warm calls when there are at least two, else of all (see ThreadGovernor).  Of an even
    count, the lower middle: on a shared machine the noise is one-sided (a stall adds
    time, nothing takes it away), and with two calls the upper middle is the slower one."""
    warm = [t for t, cold in d if not cold]
    v = sorted(warm if len(warm) >= 2 else [t for t, _ in d])
    return v[int((len(v) - 1) * q)]


def env_threads() -> int:
    """RLXC_NUM_THREADS as an int (0 = all cores)."""
    v = os.environ.get("RLXC_NUM_THREADS", "").strip()
    try:
        return max(0, int(v)) if v else 0
    except ValueError:
        raise ValueError(f"RLXC_NUM_THREADS={v!r} is not an integer") from None


def signature_text(args: list, outputs: list, workspace_size: int) -> str:
    """The canonical text of a library's signature: what its `ENTRY_signature()` symbol
    returns (lowering/llvmgen.py) and what its metadata must describe."""
    import json

    return json.dumps({"abi": ABI, "args": [[a["name"], a["kind"], a["dtype"], list(a["shape"])]
                                            for a in args],
                       "outputs": [[o["dtype"], list(o["shape"])] for o in outputs],
                       "workspace": int(workspace_size)}, separators=(",", ":"))


class SplitControl:
    """The batch-split controls of a loaded library, static (CpuLibrary) or size-generic
    (runtime/dyncpu.py): the entry's `_set_batch_split` / `_last_split` symbols
    (lowering/cpu/batchsplit_entry.py), absent when the program does not split;
    RLXC_BATCH_SPLIT=0 turns the split off at load."""

    _split_set = _split_last = None

    def _bind_split(self, lib, entry: str) -> None:
        s = getattr(lib, f"{entry}_set_batch_split", None)
        last = getattr(lib, f"{entry}_last_split", None)
        if s is None or last is None:
            return
        s.argtypes, s.restype = [ctypes.c_int64], None
        last.argtypes, last.restype = [], ctypes.c_int32
        if os.environ.get("RLXC_BATCH_SPLIT", "1") == "0":
            s(-1)
        self._split_set, self._split_last = s, last

    def set_batch_split(self, min_work: int) -> bool:
        """Run a batch-separable library's calls as one region over row chunks when their
        estimated work reaches `min_work` (< 0: never); False when the library has no split."""
        if self._split_set is None:
            return False
        self._split_set(int(min_work))
        return True

    def last_split(self) -> int:
        """Threads the calling thread's last call was split over (0: it ran unsplit)."""
        return int(self._split_last()) if self._split_last is not None else 0


class CpuLibrary(SplitControl):
    """One loaded shared library and the description of its entry point.

    The metadata is cross-checked against the library: its entry and workspace
    symbols, the workspace size, and the signature text that `ENTRY_signature()`
    returns (args, outputs and workspace; required with `require_signature`, as the
    compile cache does; checked whenever the library has it)."""

    def __init__(self, so_path: str, meta: dict, require_signature: bool = False):
        if meta.get("abi") != ABI:
            raise ArtifactError(f"{so_path}: metadata ABI {meta.get('abi')!r}, runtime {ABI}")
        self.path = so_path
        self.meta = meta
        try:
            self.lib = ctypes.CDLL(os.path.abspath(so_path))
        except OSError as e:
            raise ArtifactError(f"cannot load {so_path}: {e}") from None
        try:
            fn = getattr(self.lib, meta["entry"])
            wsf = getattr(self.lib, meta["workspace_symbol"])
        except AttributeError as e:
            raise ArtifactError(f"{so_path}: missing symbol ({e})") from None
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p] * 4
        wsf.restype = ctypes.c_int64
        wsf.argtypes = []
        self.entry = fn
        # the call path's copy (runtime/call.py CallFrame): no argtypes, so ctypes does not
        # convert the four arguments per call (~0.4-0.7 us); CallFrame always passes its
        # own pointer arrays and a c_void_p, which ctypes passes as pointers as they are
        self.entry_fast = self.lib[meta["entry"]]
        self.entry_fast.restype = ctypes.c_int32
        self.workspace_size = int(wsf())
        if self.workspace_size != int(meta["workspace_size"]):
            raise ArtifactError(f"{so_path}: workspace size {self.workspace_size} differs "
                                f"from its metadata ({meta['workspace_size']})")
        try:
            sigf = getattr(self.lib, meta["entry"] + "_signature")
        except AttributeError:
            sigf = None
            if require_signature:
                raise ArtifactError(f"{so_path}: missing symbol {meta['entry']}_signature")
        if sigf is not None:
            sigf.restype = ctypes.c_char_p
            sigf.argtypes = []
            have = (sigf() or b"").decode("utf-8", "replace")
            try:
                want = signature_text(meta["args"], meta["outputs"], meta["workspace_size"])
            except (KeyError, TypeError, ValueError) as e:
                raise ArtifactError(f"{so_path}: malformed metadata ({e!r})") from None
            if have != want:
                raise ArtifactError(f"{so_path}: the metadata's signature {want} differs "
                                    f"from the library's own {have}")
        self.args = meta["args"]
        self.inputs = [a for a in self.args if a["kind"] == "input"]
        self.params = [a for a in self.args if a["kind"] == "param"]
        self.outputs = [(tuple(o["shape"]), NP_DTYPES[o["dtype"]]) for o in meta["outputs"]]
        self.errors = {int(k): tuple(v) for k, v in meta.get("errors", {}).items()}
        self.error_args = {int(k): tuple(v) for k, v in meta.get("error_args", {}).items()}
        # bound weights the prepacked entry may take packed (runtime/prepack.py)
        self.prepack = list(meta.get("prepack") or [])
        self.entry_prepacked = None
        if self.prepack:
            try:
                for spec in self.prepack:
                    check_spec(spec)
                    par = self.params[int(spec["param"])]
                    if par["dtype"] != "f32" or _numel(par["shape"]) != spec["k"] * spec["n"]:
                        raise ValueError(f"param {par['name']!r} is {par['dtype']} "
                                         f"{par['shape']}, not {spec['k']} x {spec['n']}")
                self.entry_prepacked = self.lib[meta["prepack_entry"]]
            except (AttributeError, KeyError, IndexError, ValueError) as e:
                raise ArtifactError(f"{so_path}: bad prepack metadata ({e})") from None
            self.entry_prepacked.restype = ctypes.c_int32
        self._set_threads = getattr(self.lib, "rlxc_set_num_threads", None)
        if self._set_threads is not None:
            self._set_threads.argtypes = [ctypes.c_int32]
            self._set_threads.restype = None
        # a program that never forks has nothing to tune (meta["parallel"], lowering/cpu/driver.py)
        self.governor = ThreadGovernor(self._set_threads, env_threads(),
                                       bool(meta.get("parallel", True)))
        self.cache_key = None  # set by rlxc.backends: the disk cache entry it came from
        # batch split of a static program (lowering/cpu/batchsplit_static.py)
        self._bind_split(self.lib, meta["entry"])

    def set_num_threads(self, n: int) -> None:
        """Most threads for this library's parallel loops and sgemm (0 = all cores); calls
        use one thread instead while that is faster (see ThreadGovernor)."""
        self.governor.configure(int(n))

    def error(self, rc: int, frame=None) -> Exception:
        """The exception of return code `rc`.  For an index check on an argument, with the
        call's `frame` (runtime/call.py: its pointer tables), the message also names the
        first offending value and its position, read back from the argument (error path
        only: the kernels stay a plain range check)."""
        kind, msg = self.errors.get(rc, ("RlxError", f"{self.meta['entry']} failed with "
                                                     f"error code {rc}"))
        where = self.error_args.get(rc)
        if where is not None and frame is not None:
            msg += _offending_index(self, frame, *where)
        return _EXC.get(kind, RlxError)(msg)


class _ThreadState(CallFrame):
    """A thread's CallFrame (runtime/call.py), plus whether the bound params are pointed
    and the large outputs of its last call (for reuse once released)."""

    __slots__ = ("bound", "prev")

    def __init__(self, lib: CpuLibrary, packed: list | None = None):
        super().__init__(lib, packed=packed)
        self.bound = False
        self.prev = None  # the large outputs of the last call, for reuse once released


class CpuCaller:
    """Calls one library; optionally with params bound once (their pointers pre-written).

    `call(inputs, params=None)`: `inputs` in input order, `params` in param order
    (required unless bound).  Returns the outputs as new arrays.

    Bound params that the library's matmul chains multiply by (lib.prepack) are packed
    here once, when they are read-only arrays (a Func owns its bound arrays and makes
    them read-only; a writeable one could change under the packed copy, so its slot
    stays NULL: packed per call), and the calls go through the prepacked entry;
    RLXC_PREPACK=0 turns this off.  A call that passes its own params runs with every
    slot NULL."""

    def __init__(self, lib: CpuLibrary, params: list | None = None):
        self.lib = lib
        self._params = None if params is None else list(params)
        self._packed = None
        if self._params is not None and lib.prepack and \
                os.environ.get("RLXC_PREPACK", "1") != "0":
            packed = [None if _writeable(self._params[int(s["param"])]) else
                      pack_weight(self._params[int(s["param"])], s) for s in lib.prepack]
            self._packed = packed if any(p is not None for p in packed) else None
        self._local = threading.local()
        self._out_specs = lib.outputs
        self._reuse = _env_flag("RLXC_REUSE_OUTPUTS") and any(
            np.dtype(d).itemsize * _numel(s) >= REUSE_MIN_BYTES for s, d in lib.outputs)

    def _state(self) -> _ThreadState:
        st = getattr(self._local, "st", None)
        if st is None:
            st = self._local.st = _ThreadState(self.lib, self._packed)
            if self._params is not None:
                for i, p in enumerate(self._params):
                    st.pars[i] = _addr(p)
                st.bound = True
        return st

    def call(self, inputs, params=None) -> list:
        try:
            st = self._local.st
        except AttributeError:
            st = self._state()
        ins = st.ins
        for i, a in enumerate(inputs):
            ins[i] = _addr(a)
        if params is not None:
            pars = st.pars
            for i, a in enumerate(params):
                pars[i] = _addr(a)
            st.bound = False
            packed = st.packed
            if packed is not None:   # these params are not the packed ones
                for j in range(len(params), len(params) + len(packed)):
                    pars[j] = None
        elif not st.bound:
            raise RlxError(f"{self.lib.meta['entry']}: params not bound")
        optr = st.outs
        if self._reuse:
            outs = self._outputs(st)
            for i, o in enumerate(outs):
                optr[i] = _addr(o)
        else:
            outs = []
            for i, (s, d) in enumerate(self._out_specs):
                o = np.empty(s, d)
                optr[i] = _addr(o)
                outs.append(o)
        if params is None or self._params is None:
            st.invoke()
            return outs
        try:
            st.invoke()
        finally:
            for i, p in enumerate(self._params):  # restore the bound pointers
                st.pars[i] = _addr(p)
            if st.packed is not None:
                for j, a in enumerate(st.packed):
                    st.pars[len(self._params) + j] = None if a is None else _addr(a)
            st.bound = True
        return outs

    def _outputs(self, st) -> list:
        """Fresh outputs, except large ones whose previous array is gone.

        A large output is a 64-byte aligned view of a private byte buffer `raw`; only
        `raw` is kept in `st.prev` (the returned array is not), so the array dies as
        soon as the caller drops it and every view of it, and weak references to it are
        cleared then.  The buffer is written again only when nothing but that list and
        getrefcount's argument hold `raw` (any array or view of it has raw as its base,
        NumPy collapses view chains; a buffer export holds the array) and no weak
        reference to `raw` exists: no reference of any kind can reach the old data."""
        prev = st.prev
        outs, keep = [], []
        for i, (s, d) in enumerate(self._out_specs):
            nbytes = np.dtype(d).itemsize * _numel(s)
            if nbytes < REUSE_MIN_BYTES:
                outs.append(np.empty(s, d))
                keep.append(None)
                continue
            raw = prev[i] if prev is not None else None
            if raw is None or sys.getrefcount(raw) != 3 or _weakrefs(raw):
                raw = np.empty(nbytes + 64, np.uint8)  # (3: prev, `raw` and the argument)
            off = -_addr(raw) % 64
            outs.append(raw[off:off + nbytes].view(d).reshape(s))
            keep.append(raw)
        st.prev = keep
        return outs


def _writeable(a) -> bool:
    return not isinstance(a, np.ndarray) or bool(a.flags.writeable)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class CpuExecutor:
    """`run(arrays)` with every argument in signature order (what Func.run passes)."""

    def __init__(self, lib: CpuLibrary):
        self.lib = lib
        self._in_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "input"]
        self._par_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "param"]
        self._caller = CpuCaller(lib)

    def run(self, arrays) -> list:
        if len(arrays) != len(self.lib.args):
            raise ValueError(f"{self.lib.meta['name']}: expected {len(self.lib.args)} arrays "
                             f"(inputs and params in signature order), got {len(arrays)}")
        args = self.lib.args
        return self._caller.call([checked_array(arrays[i], args[i]) for i in self._in_pos],
                                 [checked_array(arrays[i], args[i]) for i in self._par_pos])
