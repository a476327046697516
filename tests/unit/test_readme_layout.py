"""The README's "Repository layout" table matches the folders: every path it names exists, and
every top-level folder, every package of `broker_image/src/` and every package of
`broker_image/src/tidalmq_broker/` is named in it (or deliberately left out, below)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Repository layout"
PACKAGE_ROOTS = ["broker_image/src", "broker_image/src/tidalmq_broker"]

# What the table leaves out on purpose. Hidden entries (`.ci/`, `.git/`, `.venv/`, `.cache/`,
# tool caches) are skipped by rule; these are the build and run outputs `.gitignore` names,
# which exist only on a machine that built or ran something.
LEFT_OUT = {
    "build",  # setuptools' build directory
    "dist",  # built distributions
    "__pycache__",  # bytecode
}
LEFT_OUT_SUFFIXES = (".egg-info",)  # setuptools' metadata of an editable install


def layout_rows(text: str) -> list[str]:
    """The first cell of every body row of the layout table."""
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under {SECTION!r} in README.md"
    body = rows[2:]  # the header and the separator row
    return [row.split("|")[1] for row in body]


def named_paths(text: str) -> list[str]:
    """Every path the table names: the backticked names of the first column, each from the
    repository root."""
    names = [name for cell in layout_rows(text) for name in re.findall(r"`([^`]+)`", cell)]
    assert names, "the layout table names no path"
    return names


def _left_out(name: str) -> bool:
    return name.startswith(".") or name in LEFT_OUT or name.endswith(LEFT_OUT_SUFFIXES)


def folders_to_name() -> set[str]:
    """Top-level folders and the packages of PACKAGE_ROOTS, as the table writes them."""
    wanted = {f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and not _left_out(p.name)}
    for base in PACKAGE_ROOTS:
        for p in (ROOT / base).iterdir():
            if p.is_dir() and not _left_out(p.name) and (p / "__init__.py").is_file():
                wanted.add(f"{base}/{p.name}/")
    return wanted


def _normal(name: str) -> str:
    return name.strip().rstrip("/") + "/" if (ROOT / name.strip()).is_dir() else name.strip()


def test_every_named_path_exists() -> None:
    missing = []
    for name in named_paths(README.read_text()):
        path = ROOT / name
        if not path.exists() or (name.endswith("/") and not path.is_dir()):
            missing.append(name)
    assert not missing, f"the README's layout table names what does not exist: {missing}"


def test_every_folder_and_package_is_named() -> None:
    named = {_normal(n) for n in named_paths(README.read_text())}
    unnamed = sorted(folders_to_name() - named)
    assert not unnamed, (
        f"not in the README's layout table (add a row, or to LEFT_OUT with a reason): {unnamed}"
    )
