"""The spare broker process of `local up` (tidalmq_broker/local/spare.py): which brokers it
may become, and that it ends when nobody needs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tidalmq_broker.local.spare import SpareBroker, shared_env


def spare(env: dict[str, str]) -> SpareBroker:
    return SpareBroker(sys.executable, env, ["--data-dir", "/nowhere"])


def test_only_the_control_variables_may_differ_from_the_spares_environment() -> None:
    base = {"PATH": os.environ.get("PATH", ""), "TIDALMQ_LOG_FORMAT": "text"}
    s = spare(base)
    try:
        # its own token and certificates are given at the hand-over
        mine = {**base, "TIDALMQ_CONTROL_TOKEN": "t", "TIDALMQ_CONTROL_TLS_CA_FILE": "/ca"}
        assert s.fits(mine, linked=True)
        # the allocator (or any other setting) was fixed when its interpreter started
        assert not s.fits({**base, "PYTHONMALLOC": "malloc"}, linked=True)
        assert not s.fits({**base, "TIDALMQ_LOG_FORMAT": "json"}, linked=True)
        assert shared_env(mine) == base
    finally:
        s.discard()
        assert s.proc.wait(30) == 0


def test_a_spare_nobody_needs_exits_at_the_end_of_its_input_and_a_dead_one_fits_nothing(
    tmp_path: Path,
) -> None:
    s = spare(dict(os.environ))
    s.discard()  # as `local up` stopping (or gone: the pipe's end is the same)
    assert s.proc.wait(30) == 0
    assert not s.fits(dict(os.environ), linked=False)
    assert not s.hand_over(["broker"], {}, tmp_path / "log")


def test_the_spare_becomes_the_command_it_is_handed_with_its_environment_and_log(
    tmp_path: Path,
) -> None:
    """`tidalmq broker --help` through the hand-over: the same parser, output in the log."""
    s = spare(dict(os.environ))
    log = tmp_path / "broker.log"
    assert s.hand_over(["broker", "--help"], {**os.environ, "TIDALMQ_X": "1"}, log)
    assert s.proc.wait(60) == 0
    text = log.read_text()
    assert "Run one TidalMQ broker" in text
    assert s.cmd[-2:] == ["--data-dir", "/nowhere"]
