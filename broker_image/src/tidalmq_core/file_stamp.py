"""What identifies a file's contents cheaply (one stat), for the TLS contexts that follow their
files: a renewal rewrites a file or, on a Kubernetes Secret volume, swaps the `..data` link, and
either changes the stamp. Stdlib only."""

from __future__ import annotations

import os

Stamp = tuple[int, int, int, int] | None


def file_stamp(path: str) -> Stamp:
    """(device, inode, mtime ns, size) of `path`, following links as a loader does; None for
    no path, (-1, -1, -1, -1) for a file that cannot be read now (gone for a moment)."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
