"""Which processes re-execute on glibc's malloc (tuning.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tidalmq_broker import tuning
from tidalmq_broker.tuning import wants_system_malloc


@pytest.mark.parametrize(
    ("argv", "env", "wanted"),
    [
        (["broker", "--port", "9092"], {}, True),
        (["broker"], {"PYTHONMALLOC": "pymalloc"}, False),  # chosen by whoever started it
        (["broker"], {"TIDALMQ_RUNTIME_TUNING": "false"}, False),
        (["broker", "--runtime-tuning", "off"], {}, False),
        (["broker", "--runtime-tuning=0"], {}, False),
        (["broker", "--runtime-tuning", "true"], {"TIDALMQ_RUNTIME_TUNING": "0"}, True),
        (["local", "up"], {}, False),  # not a broker process (its brokers are)
        ([], {}, False),
    ],
)
def test_wants_system_malloc(argv: list[str], env: dict[str, str], wanted: bool) -> None:
    assert wants_system_malloc(argv, env) is wanted


def test_the_broker_command_runs_on_glibc_malloc() -> None:
    """The command re-executes itself with PYTHONMALLOC=malloc: the re-executed program sees it
    in its environment (`--help` then exits before starting anything)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    code = (
        "import os, sys, runpy; sys.argv = ['tidalmq', 'broker', '--help']; "
        "os.environ.get('PYTHONMALLOC') and print('ALLOCATOR', os.environ['PYTHONMALLOC']); "
        "runpy.run_module('tidalmq_broker.cli', run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ALLOCATOR malloc" in out.stdout


def test_a_child_broker_gets_the_allocator_in_its_environment_not_by_a_re_exec() -> None:
    """`tidalmq local up` starts its brokers on glibc's malloc directly (no second start)."""
    env = tuning.allocator_env(["broker", "--broker-id", "0"], {})
    assert env == ({"PYTHONMALLOC": "malloc"} if tuning._is_glibc() else {})
    assert tuning.allocator_env(["broker"], {"PYTHONMALLOC": "pymalloc"}) == {}
    assert tuning.allocator_env(["broker", "--runtime-tuning", "false"], {}) == {}
    assert tuning.allocator_env(["local", "up"], {}) == {}
    # with it in the environment, the child does not re-execute itself
    assert not tuning.wants_system_malloc(["broker"], {**env, "PYTHONMALLOC": "malloc"})
