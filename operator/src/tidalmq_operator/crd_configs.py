"""The `spec.configs` schema of the Topic and StaticTopic CRDs, generated from the broker's one
table of topic configs (`tidalmq_core.topics.TOPIC_CONFIG_DEFS`), and the command that writes it
into the CRD files (the rest of each file is written by hand):

    python -m tidalmq_operator.crd_configs           # rewrites crds/ and the chart's copies
    python -m tidalmq_operator.crd_configs --check   # exit 1 naming the files that differ

`make crds` runs the first; a chart test (charts/tidalmq/tests/test_crds.py) the comparison.

What the schema says of each config (docs/topic-configs.md, "The Topic and StaticTopic
resources"): INT and LONG are an integer or a string of digits, with the table's range as
minimum/maximum (on integers; a string out of range is refused by the operator's validation,
the broker's, with an Error condition); DOUBLE is a number with its range; BOOLEAN a boolean;
STRING one of the table's values; LIST a comma-separated string of the allowed items. Where
TidalMQ takes only some of Kafka's values (`only`), the schema allows only those. Kafka's
internal configs are not offered.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from tidalmq_core.topics import (
    INT_MAX,
    INT_MIN,
    STATIC_CLEANUP_POLICIES,
    TOPIC_CONFIG_DEFS,
    TopicConfigDef,
    narrowing,
)

REPO = Path(__file__).resolve().parents[3]
# the CRD files holding a generated configs schema, and whether theirs is a static topic's
FILES = {"topics.tidalmq.io.yaml": False, "statictopics.tidalmq.io.yaml": True}
DIRS = (REPO / "crds", REPO / "charts" / "tidalmq" / "crds")
BEGIN = "# generated from TOPIC_CONFIG_DEFS (broker_image/src/tidalmq_core/topics.py)"
END = "# end of the generated configs"


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _lowest(d: TopicConfigDef) -> float | None:
    """The least value taken: the range's, or the one value taken below it (gzip's -1)."""
    if d.or_equal is not None and d.at_least is not None:
        return min(d.at_least, d.or_equal)
    return d.at_least


def _integer_pattern(d: TopicConfigDef) -> str:
    """The digits a string value may have: a sign only where the range has negative values."""
    if d.only:
        return "^(" + "|".join(re.escape(v) for v in d.only) + ")$"
    lowest = _lowest(d)
    if lowest is None or lowest < -9:
        return "^-?[0-9]+$"
    if lowest >= 0:
        return "^[0-9]+$"
    if lowest == -1:
        return "^(-1|[0-9]+)$"
    return f"^(-[1-{-int(lowest)}]|[0-9]+)$"


def _list_pattern(items: tuple[str, ...]) -> str:
    """Kafka's LIST: comma-separated items, blanks around them, none at all (empty) taken."""
    one = "(" + "|".join(re.escape(i) for i in items) + ")"
    return rf"^\s*({one}(\s*,\s*{one})*)?\s*$"


def _range(d: TopicConfigDef) -> str:
    if d.or_equal is not None and d.at_least is not None and d.at_most is not None:
        return f"{_number(d.at_least)} to {_number(d.at_most)}, or {d.or_equal}"
    if d.at_least is not None and d.at_most is not None:
        return f"{_number(d.at_least)} to {_number(d.at_most)}"
    if d.at_least is not None:
        return f"at least {_number(d.at_least)}"
    return ""


def description(d: TopicConfigDef, *, static: bool = False) -> str:
    """The config's `doc`, then Kafka's type and check, then what TidalMQ narrows."""
    check = _range(d)
    if d.one_of:
        check = ("one of " if d.type == "STRING" else "each of ") + ", ".join(d.one_of)
    text = f"{d.doc} {d.type}" + (f", {check}." if check else ".")
    narrowed = narrowing(d, static=static)
    return f"{text} {narrowed}" if narrowed else text


def config_schema(d: TopicConfigDef, *, static: bool = False) -> dict[str, Any]:
    """One config's schema (OpenAPI v3, structural) from its row of the table."""
    node: dict[str, Any] = {"description": description(d, static=static)}
    if d.type in ("INT", "LONG"):
        node["x-kubernetes-int-or-string"] = True
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        node["pattern"] = _integer_pattern(d)
        if d.only:
            node["minimum"] = min(int(v) for v in d.only)
            node["maximum"] = max(int(v) for v in d.only)
            return node
        lowest = _lowest(d)
        # Kafka's INT is Java's int: its bounds where the range has none. Its LONG is Java's
        # long, which is what Kubernetes' integers are already; the API server keeps a schema's
        # bounds as float64, and 2^63-1 as a bound came out as -2^63 (refusing every value)
        if lowest is not None:
            node["minimum"] = _number(lowest)
        elif d.type == "INT":
            node["minimum"] = INT_MIN
        if d.at_most is not None:
            node["maximum"] = _number(d.at_most)
        elif d.type == "INT":
            node["maximum"] = INT_MAX
    elif d.type == "DOUBLE":
        node["type"] = "number"
        if d.at_least is not None:
            node["minimum"] = _number(d.at_least)
        if d.at_most is not None:
            node["maximum"] = _number(d.at_most)
    elif d.type == "BOOLEAN":
        node["type"] = "boolean"
        if d.only:
            node["enum"] = [v == "true" for v in d.only]
    elif d.type == "STRING":
        node["type"] = "string"
        if d.only or d.one_of:
            node["enum"] = list(d.only or d.one_of)
    elif d.replicas:  # LIST: "*" or partition:broker pairs
        node["type"] = "string"
        # Kafka's ThrottledReplicaListValidator: "*", or items each empty or partition:broker
        pair = "([0-9]+:[0-9]+)?"
        node["pattern"] = rf"^\s*(\*|{pair}(\s*,\s*{pair})*)\s*$"
    else:  # LIST of allowed items
        node["type"] = "string"
        items = d.only or d.one_of
        if static and d.name == "cleanup.policy":
            items = STATIC_CLEANUP_POLICIES
        if items:
            node["pattern"] = _list_pattern(items)
    return node


def configs_properties(*, static: bool = False) -> dict[str, Any]:
    """`spec.configs.properties`: every public config of the table, in Kafka's order."""
    return {d.name: config_schema(d, static=static) for d in TOPIC_CONFIG_DEFS if not d.internal}


def render(text: str, *, static: bool) -> str:
    """The CRD file's text with its generated block (from the BEGIN line to the END line, at
    BEGIN's indentation) written anew."""
    # the operator's image has PyYAML (kubernetes' dependency), without stubs; only this command
    # needs it
    import yaml  # type: ignore[import-untyped]

    lines = text.splitlines(keepends=True)
    begin = next((i for i, line in enumerate(lines) if line.strip().startswith(BEGIN)), None)
    end = next((i for i, line in enumerate(lines) if line.strip() == END), None)
    if begin is None or end is None or end < begin:
        raise ValueError(f"no generated configs block ({BEGIN!r} ... {END!r})")
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    body = yaml.safe_dump(
        {"properties": configs_properties(static=static)},
        sort_keys=False,
        width=100 - len(indent),
        allow_unicode=True,
    )
    block = [f"{indent}{BEGIN}\n", f"{indent}# by `make crds`: edit the table, not these lines\n"]
    block += [f"{indent}{line}\n" for line in body.splitlines()]
    block.append(f"{indent}{END}\n")
    return "".join(lines[:begin] + block + lines[end + 1 :])


def expected(dirs: tuple[Path, ...] = DIRS) -> dict[Path, str]:
    """Each CRD file with a generated block, as the generator writes it (the chart's copies
    from crds/' hand-written text, so a copy that drifted shows up too)."""
    out = {}
    for name, static in FILES.items():
        text = render((dirs[0] / name).read_text(), static=static)
        for folder in dirs:
            out[folder / name] = text
    return out


def stale(dirs: tuple[Path, ...] = DIRS) -> list[Path]:
    """The CRD files that differ from what the generator writes."""
    return [p for p, text in expected(dirs).items() if not p.exists() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        for p in differ:
            print(f"{p} differs from the generated one: run `make crds`", file=sys.stderr)
        return 1 if differ else 0
    for p, text in expected().items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
