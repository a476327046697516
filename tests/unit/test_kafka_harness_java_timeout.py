"""A Java check that hangs is named in the failure (bench/kafka/harness.py run_java): past its
timeout the JVM is asked for a thread dump (SIGQUIT), killed, and the error carries the stacks
of its main and Kafka threads and the tail of what it printed on stderr. A stand-in for the JVM
here: a Python process that prints a dump on SIGQUIT as the JVM does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.kafka.harness import JavaTimedOut, ToolError, java_thread_stacks, run_java

JVM_STAND_IN = r"""
import signal, sys, time
DUMP = '''Full thread dump OpenJDK 64-Bit Server VM:

"main" #1 prio=5 os_prio=0 tid=0x1 nid=0x2 runnable
   java.lang.Thread.State: RUNNABLE
	at org.apache.kafka.clients.consumer.KafkaConsumer.poll(KafkaConsumer.java:1)
	at ClientCheck.consume(ClientCheck.java:150)

"Reference Handler" #2 daemon prio=10
	at java.lang.ref.Reference.waitForReferencePendingList(Native Method)

"kafka-coordinator-heartbeat-thread | jg-1" #20 daemon prio=5
	at java.lang.Object.wait(Native Method)
'''
signal.signal(signal.SIGQUIT, lambda *_: (print(DUMP, flush=True)))
for i in range(60):
    print(f"[{i}.0 s] received 10 of 1000", file=sys.stderr, flush=True)
print("stuck", file=sys.stderr, flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_check_past_its_timeout_says_where_it_was_stuck_and_what_it_printed(
    tmp_path: Path,
) -> None:
    (tmp_path / "jvm.py").write_text(JVM_STAND_IN)
    cmd = [sys.executable, str(tmp_path / "jvm.py")]
    with pytest.raises(JavaTimedOut) as raised:
        run_java(cmd, timeout=2.0)
    message = str(raised.value)
    assert "timed out after 2.0 seconds" in message
    assert "at ClientCheck.consume(ClientCheck.java:150)" in message
    assert '"kafka-coordinator-heartbeat-thread | jg-1"' in message
    assert "Reference Handler" not in message  # only the threads that say where the check is
    assert message.rstrip().endswith("stuck")
    assert "[59.0 s] received 10 of 1000" in message
    assert "[0.0 s] received" not in message  # the tail, not all of it


def test_a_check_that_finishes_in_time_is_returned_whole() -> None:
    done = run_java([sys.executable, "-c", "print('{}'); import sys; sys.exit(3)"], timeout=30)
    assert (done.returncode, done.stdout) == (3, "{}\n")


def test_thread_stacks_of_a_dump_keep_main_and_kafka_threads_only() -> None:
    dump = '"main" #1\n\tat A.a\n\n"other" #2\n\tat B.b\n\n"kafka-producer-network-thread" #3\n\tat C.c\n'
    assert java_thread_stacks(dump) == [
        '"main" #1',
        "\tat A.a",
        '"kafka-producer-network-thread" #3',
        "\tat C.c",
    ]


def test_a_failed_check_shows_its_report_and_the_tail_of_its_stderr() -> None:
    report = '{"mode":"consume","received":640}'
    stderr = "\n".join(f"[{i}.0 s] WARN connection to node -1 failed" for i in range(100))
    message = str(ToolError(1, ["java", "ClientCheck.java"], report + "\n", stderr))
    assert "returned non-zero exit status 1" in message
    assert report in message  # not pushed out by a long stderr
    assert "[99.0 s] WARN" in message and "[69.0 s] WARN" not in message
