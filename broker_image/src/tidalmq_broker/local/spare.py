"""A broker process started ahead of need: `local up` keeps one, and `add-broker` hands it its
command instead of starting a new interpreter.

A broker's start is mostly its interpreter loading TidalMQ and its libraries (0.7-0.9 s of CPU
on this project's 2-core machines, more than the rest of its start, its registration included),
and an added broker's partitions serve only once it is up. The spare has done that loading
already and waits, doing nothing else, for one line on its standard input: the broker's
arguments, its environment and its log file (JSON). It then becomes that broker, exactly as
`tidalmq broker ARGS` would (the same parser, settings and start). The line carries the
broker's control token, so it never appears in a process listing or an environment left
behind. A process listing shows such a broker under the spare's command line
(`python -m tidalmq_broker.local.spare_process --controller-url URL --data-dir DIR`), which is also
what `local up` records for it in cluster.json (a later `local up` stops it if it was left
behind, as any broker).

The spare starts with the environment every broker of the cluster shares (the allocator
among it: that cannot change after the interpreter started); a broker whose shared part would
differ is started the ordinary way. Nothing reads the environment at import (TIDALMQ_*
settings are read when the broker's settings are built, after the hand-over).

The spare dies with `local up`: its standard input is a pipe from `local up`, and the end of
it (`local up` gone, or stopping) makes it exit before it has done anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

# the spare's own code (a module of its own: this one is imported by the local cluster, which the
# broker's command line imports in turn)
MODULE = "tidalmq_broker.local.spare_process"


class SpareBroker:
    """One spare broker process (see the module's doc)."""

    def __init__(self, python: str, env: Mapping[str, str], labels: Sequence[str]) -> None:
        self.env = dict(env)  # what it was started with
        # `labels` (`--controller-url URL --data-dir DIR`) only name the cluster it belongs to
        # in a process listing, where it stays under this command line once it is a broker:
        # `pkill -f "controller-url URL"` finds every broker of a cluster either way
        self.cmd = [python, "-m", MODULE, *labels]
        # the parent-death link of a broker follows the thread that forked it (cluster.py):
        # only the main thread's children may become linked brokers
        self.forked_by_main = threading.current_thread() is threading.main_thread()
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            process_group=0,  # as a broker's: Ctrl-C in the terminal reaches `local up` only
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fits(self, env: Mapping[str, str], *, linked: bool) -> bool:
        """Whether the broker of `env` may be this process: alive, started with the same
        environment apart from the variables given at the hand-over (`HANDED_OVER_PREFIXES`), and
        forked by the main thread when the broker is to die with its parent."""
        if not self.alive() or (linked and not self.forked_by_main):
            return False
        return shared_env(env) == shared_env(self.env)

    def hand_over(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> bool:
        """Make the spare the broker of `argv` (the arguments after `tidalmq`); False when it
        cannot take them any more (it died meanwhile): start the broker the ordinary way."""
        order = {"argv": list(argv), "env": dict(env), "log": str(log_path)}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(order).encode() + b"\n")
            self.proc.stdin.close()
        except (OSError, ValueError):  # died meanwhile, or its input was closed (discarded)
            return False
        return True

    def discard(self) -> None:
        """No broker wanted: closing its input ends it (it exits at once)."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)


# variables that differ from broker to broker, given at the hand-over: the rest must be the
# spare's own (it is what the interpreter and the imports ran with)
HANDED_OVER_PREFIXES = ("TIDALMQ_CONTROL_",)


def shared_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(HANDED_OVER_PREFIXES)}
