"""What the benchmark's processes use: peak RSS and CPU seconds of this process and of every process under it.

    with ProcessSampler() as sampled:
        run_the_stage()
    sampled.driver, sampled.worker, sampled.worker_name   # peak RSS: this process, the largest Ray worker
    sampled.cpu_seconds()   # {"driver": s, "sampler": s, "ray::MapWorker(MapBatches(_InferenceActor))": s, "ray system: raylet": s ...}
    sampled.kind_peaks()    # {kind: {"rss", "pss", "anon": the largest process's MiB; "sum_rss", "sum_pss": the
                            #  peak of the kind's processes together; "count": most processes at once}}
    sampled.workers_total   # {"rss": MiB, "pss": MiB}: the peak over samples of the sum over every Ray worker

Memory shared between processes (a file every query actor maps, Ray's object store) is resident in each of
them: RSS counts it once per process, PSS (`/proc/PID/smaps_rollup`) divides each shared page among the
processes that map it, so a sum of PSS counts it once; `anon` is a process's anonymous memory (its heap:
what it holds on its own, no mapped file).

Linux only (`/proc`). A local Ray cluster's processes (raylet, GCS, workers) run under the driver that
started it, so sampling the driver's descendants every `every` seconds sees them all. CPU time is the
last sample of each process's user + system time, less what it had used when the sampling started: a
process that ends between two samples loses at most `every` seconds of its CPU.
"""

from __future__ import annotations

import os
import threading
import time

TICKS = os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> int:
    """Resident bytes of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def smaps(pid: int) -> dict[str, int]:
    """Bytes of a process's memory by kind from `/proc/PID/smaps_rollup` (Rss, Pss, Anonymous, Shared_Clean ...)."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except (OSError, ValueError):
        pass
    return out


def cpu(pid: int) -> float:
    """User + system CPU seconds a process has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def descendants(root: int) -> dict[int, str]:
    """pid -> command line, of every process under `root` (Ray's workers are under its raylet)."""
    parent, title = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
    under, frontier = {}, [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier and pid not in under]
        under.update({pid: title.get(pid, "") for pid in frontier})
    return under


def kind(title: str) -> str:
    """A Ray worker by what it runs ("ray::MapWorker(...)", "ray::IDLE" ...); Ray's own processes as one."""
    if title.startswith("ray::"):
        name = title.split()[0]
        # an actor running a method is "ray::Class(...).method": one kind with the idle "ray::Class(...)"
        return name[: name.rindex(")") + 1] if ")" in name else name
    if "default_worker.py" in title:
        return "ray worker (starting)"
    # Ray's own processes: gcs_server, raylet, and Python ones named by their script (log_monitor.py ...)
    words = title.split()
    scripts = [w for w in words if w.endswith(".py")]
    return "ray system: " + os.path.basename(scripts[0] if scripts else words[0] if words else "?")


class ProcessSampler:
    """Samples this process and every process under it while in use: peak RSS, CPU seconds by kind."""

    def __init__(self, every: float = 0.2, memory: bool = True):
        # memory=False reads only each process's CPU counters: `smaps_rollup` walks a process's page tables,
        # CPU that a throughput benchmark would otherwise take from the processes it measures
        self.every, self.memory, self.driver, self.worker, self.worker_name = every, memory, 0, 0, ""
        self._stop = threading.Event()
        self._start_cpu: dict[int, float] = {}
        self._last_cpu: dict[int, float] = {}
        self._kind: dict[int, str] = {}
        self._peaks: dict[str, dict[str, int]] = {}
        self.workers_total = {"rss": 0.0, "pss": 0.0}
        self._own = 0.0

    def _sample(self, first: bool = False) -> None:
        me = os.getpid()
        self.driver = max(self.driver, rss(me))
        processes = {me: "driver", **{pid: kind(title) for pid, title in descendants(me).items()}}
        for pid, name in processes.items():
            used = cpu(pid)
            if first:
                self._start_cpu[pid] = used
            self._last_cpu[pid] = max(self._last_cpu.get(pid, 0.0), used)
            # a worker's title changes once it runs a task: the last one counts; a process that is ending
            # shows no command line ("?"), and keeps the kind it had
            if name not in ("ray worker (starting)", "ray system: ?") or pid not in self._kind:
                self._kind[pid] = name
        if self.memory:
            self._sample_memory(processes)

    def _sample_memory(self, processes: dict[int, str]) -> None:
        total = {"rss": 0, "pss": 0}
        by_kind: dict[str, dict[str, int]] = {}
        for pid, name in processes.items():
            if name.startswith("ray::") or name == "ray worker (starting)":
                size = rss(pid)
                if size > self.worker:
                    self.worker, self.worker_name = size, name
                memory = smaps(pid)
                figures = {
                    "rss": memory.get("Rss", size),
                    "pss": memory.get("Pss", size),
                    "anon": memory.get("Anonymous", 0),
                }
                peak = self._peaks.setdefault(self._kind[pid], {"rss": 0, "pss": 0, "anon": 0})
                for k, v in figures.items():
                    peak[k] = max(peak[k], v)
                total["rss"] += figures["rss"]
                total["pss"] += figures["pss"]
                summed = by_kind.setdefault(self._kind[pid], {"count": 0, "sum_rss": 0, "sum_pss": 0})
                summed["count"] += 1
                summed["sum_rss"] += figures["rss"]
                summed["sum_pss"] += figures["pss"]
        for name, summed in by_kind.items():
            peak = self._peaks[name]
            for k, v in summed.items():
                peak[k] = max(peak.get(k, 0), v)
        for k, v in total.items():
            self.workers_total[k] = max(self.workers_total[k], round(v / 2**20, 1))

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()
        self._own = time.thread_time()  # this thread's CPU, which the driver's counters include

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used while sampling, by process kind (largest first)."""
        out: dict[str, float] = {"sampler": self._own}
        for pid, used in self._last_cpu.items():
            name = self._kind[pid]
            out[name] = out.get(name, 0.0) + used - self._start_cpu.get(pid, 0.0)
        out["driver"] -= self._own  # the driver's own work, less this sampling
        return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def kind_peaks(self) -> dict[str, dict[str, float]]:
        """Per Ray worker kind, the peak RSS, PSS and anonymous memory (MiB) of its largest process."""
        return {
            k: {m: (v if m == "count" else round(v / 2**20, 1)) for m, v in p.items()} for k, p in self._peaks.items()
        }

    def __enter__(self) -> ProcessSampler:
        self._sample(first=True)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
