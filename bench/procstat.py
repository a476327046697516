"""What the benchmarks read about processes and the machine from /proc: a process's CPU seconds,
its resident memory, whether it still runs, its children, and the load average printed beside
every figure (the machine is shared: a figure is read with the load it was taken under).

Owns the parsing of /proc/<pid>/stat, /proc/<pid>/status and /proc/<pid>/task/*/schedstat, in
one place; the parsers take text so tests can feed them lines. Must not know any benchmark: it
measures processes, never brokers or clusters. Linux only, as the benchmarks are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
KIB = 1024


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat the benchmarks use (proc(5) numbers them from 1)."""

    state: str  # field 3: R, S, D, Z, ...
    ppid: int  # field 4
    utime_ticks: int  # field 14, user time in clock ticks
    stime_ticks: int  # field 15, system time in clock ticks

    @property
    def cpu_ticks(self) -> int:
        return self.utime_ticks + self.stime_ticks

    @property
    def cpu_s(self) -> float:
        return self.cpu_ticks / CLOCK_TICKS


def parse_stat(text: str) -> Stat:
    """One line of /proc/<pid>/stat. The command name (field 2, in parentheses) may itself hold
    spaces and parentheses, so the fields are counted from after its last ')'."""
    _, sep, rest = text.rpartition(")")
    if not sep:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    fields = rest.split()
    # fields[0] is field 3 (state): field n is fields[n - 3]
    return Stat(
        state=fields[0],
        ppid=int(fields[1]),
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
    )


def parse_status_rss_kib(text: str) -> int:
    """VmRSS of /proc/<pid>/status in KiB; 0 when absent (a zombie or a kernel thread)."""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def stat(pid: int | str) -> Stat:
    """/proc/<pid>/stat parsed; OSError when the process is gone."""
    return parse_stat(Path(f"/proc/{pid}/stat").read_text())


def cpu_s(pid: int | str) -> float:
    """User + system CPU seconds of the process (every thread, exited ones included), to the
    clock tick (10 ms)."""
    return stat(pid).cpu_s


def precise_cpu_s(pid: int) -> float:
    """The process's CPU seconds to the nanosecond for its live threads: their run time from
    schedstat, plus what its exited threads used (utime + stime count those, in clock ticks; so
    do the live threads, whose share is taken out). For short windows where a clock tick is
    too coarse."""
    live_ns = 0
    live_ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            live_ns += int((task / "schedstat").read_text().split()[0])
            live_ticks += parse_stat((task / "stat").read_text()).cpu_ticks
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    all_ticks = stat(pid).cpu_ticks
    return live_ns / 1e9 + max(0, all_ticks - live_ticks) / CLOCK_TICKS


def threads_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of the process by thread id (the main thread's is the
    pid), from schedstat (to the nanosecond). A thread that exited is not in it. (Python 3.11
    does not name its threads for the kernel: the ids are what tells them apart.)"""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return out


def threads_stat(pid: int) -> dict[int, Stat]:
    """/proc/<pid>/task/<tid>/stat of each live thread by thread id (user and system time in
    clock ticks: which thread spends its time in the kernel)."""
    out: dict[int, Stat] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = parse_stat((task / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return out


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of the process in bytes; 0 when it is gone."""
    try:
        return parse_status_rss_kib(Path(f"/proc/{pid}/status").read_text()) * KIB
    except OSError:
        return 0


def running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        return stat(pid).state != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`, in order."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if stat(entry.name).ppid == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
    return sorted(out)


def cmdline(pid: int) -> bytes:
    """The process's arguments, NUL-separated as the kernel keeps them."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


# ------------------------------------------------------------------------------ machine load
def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages, to two decimals (for JSON figures)."""
    return [round(x, 2) for x in os.getloadavg()]


def load1() -> str:
    """The 1-minute load average as printed beside a figure: "load 1.3"."""
    return f"load {os.getloadavg()[0]:.1f}"


def load_triple() -> str:
    """The 1/5/15-minute load averages as one cell of a table: "1.3/0.9/0.7"."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())
