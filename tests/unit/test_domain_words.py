"""Code, docs and resources speak the domain's words (topics, partitions, moves, static topics),
never the names of the documents a design came from ("seed 002"): a reader has no such document."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["broker_image/src", "operator/src", "spark/src", "charts", "crds", "docs", "README.md"]
ORIGIN_NAME = re.compile(r"\bseeds? \d{3}\b", re.IGNORECASE)


def test_no_origin_document_is_named() -> None:
    found = []
    for entry in SCANNED:
        base = ROOT / entry
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".md", ".yaml", ".tpl", ".txt"}:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if ORIGIN_NAME.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "origin documents named instead of the domain's words:\n" + "\n".join(found)


FORMATTER_ESCAPE = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def _formatter_escapes(*entries: str) -> list[str]:
    escapes = []
    for entry in entries:
        for path in sorted((ROOT / entry).rglob("*.py")):
            if ".venv" in path.parts or path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if FORMATTER_ESCAPE.search(line):
                    escapes.append(f"{path.relative_to(ROOT)}:{n}")
    return escapes


def test_the_formatter_formats_product_code() -> None:
    """Formatting is ruff format's: a per-line escape is for a table that reads better aligned,
    with its reason on the line, and there are few of them ([A1])."""
    escapes = _formatter_escapes("broker_image/src", "operator/src", "spark/src", "observability")
    assert len(escapes) < 15, f"{len(escapes)} formatter escapes in product code: {escapes}"


def test_the_formatter_formats_tests_and_benchmarks() -> None:
    """Tests, end-to-end tests and benchmarks are read as often as the product: no per-line
    escapes there at all (they once held 1,124, formatting by hand again)."""
    escapes = _formatter_escapes("tests", "e2e", "bench")
    assert not escapes, f"{len(escapes)} formatter escapes in tests: {escapes[:20]}"
