"""Where threads are: for a test or the exit guard to say which threads are stuck, and where."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterable


def thread_stacks(threads: Iterable[threading.Thread]) -> str:
    """Each thread's name and current stack (a thread that has ended meanwhile: its name only)."""
    frames = sys._current_frames()
    out = []
    for t in threads:
        out.append(f"--- thread {t.name!r}")
        frame = frames.get(t.ident or -1)
        if frame is not None:
            out.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(out)
