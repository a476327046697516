"""bench/procstat.py: the one parser of /proc the benchmarks share.

The benchmarks' CPU and memory figures and their "is the broker still running" waits all come
from these lines; a command name with spaces or parentheses (a thread renamed by the broker, a
JVM's "(java)") must not shift the fields."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import procstat

# a real line (kernel 6.x), with a command name that holds spaces and a ')'
STAT = (
    "4242 (tidalmq (broker) 1) S 4200 4242 4200 0 -1 4194560 12345 0 0 0 "
    "250 75 0 0 20 0 9 0 123456 987654321 54321 18446744073709551615 1 1 0 0 0 0 0 "
    "16781312 17642 0 0 0 17 1 0 0 0 0 0"
)

STATUS = """Name:\ttidalmq
Umask:\t0022
State:\tS (sleeping)
Pid:\t4242
VmPeak:\t  900000 kB
VmRSS:\t  123456 kB
RssAnon:\t  100000 kB
Threads:\t9
"""


def test_stat_fields_are_counted_after_the_command_name() -> None:
    st = procstat.parse_stat(STAT)
    assert st.state == "S"
    assert st.ppid == 4200
    assert (st.utime_ticks, st.stime_ticks) == (250, 75)
    assert st.cpu_ticks == 325
    assert st.cpu_s == pytest.approx(325 / procstat.CLOCK_TICKS)


def test_a_zombie_is_not_running_by_its_state() -> None:
    zombie = STAT.replace(") S 4200", ") Z 4200")
    assert procstat.parse_stat(zombie).state == "Z"


def test_a_line_without_a_command_name_is_refused() -> None:
    with pytest.raises(ValueError):
        procstat.parse_stat("4242 tidalmq S 4200")


def test_status_rss_in_kib_and_zero_when_absent() -> None:
    assert procstat.parse_status_rss_kib(STATUS) == 123456
    kernel_thread = "".join(ln + "\n" for ln in STATUS.splitlines() if "VmRSS" not in ln)
    assert procstat.parse_status_rss_kib(kernel_thread) == 0


def test_this_process_read_from_proc() -> None:
    """The readers over the real /proc: this process runs, holds memory, spends CPU, and a
    child it started is among its children until reaped; a reaped pid is not running."""
    assert procstat.running(os.getpid())
    assert procstat.rss_bytes() > 10 << 20  # this interpreter with pytest loaded
    assert procstat.rss_bytes(os.getpid()) > 10 << 20
    before = procstat.cpu_s(os.getpid())
    precise_before = procstat.precise_cpu_s(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert procstat.cpu_s(os.getpid()) > before
    assert procstat.precise_cpu_s(os.getpid()) - precise_before >= 0.08
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in procstat.children(os.getpid())
        assert b"time.sleep(30)" in procstat.cmdline(child.pid)
        assert procstat.running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not procstat.running(child.pid)
    assert procstat.rss_bytes(child.pid) == 0


def test_load_figures() -> None:
    three = procstat.loadavg()
    assert len(three) == 3 and all(x >= 0 for x in three)
    assert procstat.load1().startswith("load ")
    assert len(procstat.load_triple().split("/")) == 3


def test_each_thread_by_its_id() -> None:
    """The whole-process figures split the event loop's thread (the pid) from the others: a
    thread that burns CPU shows under its own id, not the main thread's."""
    import threading

    ids: list[int] = []
    busy = threading.Event()

    def spin() -> None:
        ids.append(threading.get_native_id())
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        busy.set()
        time.sleep(0.5)  # alive while it is read

    t = threading.Thread(target=spin)
    t.start()
    assert busy.wait(10)
    cpu = procstat.threads_cpu_s(os.getpid())
    stats = procstat.threads_stat(os.getpid())
    t.join()
    assert os.getpid() in cpu and os.getpid() in stats
    assert cpu[ids[0]] >= 0.04  # its 50 ms of CPU, to the nanosecond
    assert ids[0] in stats
