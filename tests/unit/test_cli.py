"""The `tidalmq` command line ([U1] item 4): what a command imports before it runs (the start
time), defaults in every --help, one-line messages for malformed input, the JSON documents and
the progress of add-broker / remove-broker."""

from __future__ import annotations

import argparse
import io
import json
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker import cli
from tidalmq_broker.cli_args import (
    HelpFormatter,
    bootstrap_servers,
    http_url,
    id_list,
    split_address,
)
from tidalmq_broker.commands import BUILTIN_NAMES
from tidalmq_broker.local.client import ChangeResult, MoveCount
from tidalmq_broker.progress import Progress, line
from tidalmq_broker.protocol.codec import encode_response, peek_header
from tidalmq_broker.reassign_cli import topics_to_move, verify_status
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry

# what a command that does not need them must never import: each costs tens to hundreds of ms
HEAVY = (
    "asyncio",
    "aiohttp",
    "boto3",
    "botocore",
    "confluent_kafka",
    "kafka",  # kafka-python
    "kio",
    "kopf",
    "kubernetes",
    "numpy",
    "prometheus_client",
    "pyarrow",
    "pyspark",
    "uvloop",
    "tidalmq_controller",
    "tidalmq_operator",
    "tidalmq_planner",
    "tidalmq_broker.storage.engine",
    "tidalmq_broker.storage.objectstore",
    "tidalmq_broker.protocol",  # the broker's codec (kio): admin_wire encodes the CLI's requests
    "tidalmq_broker.settings",
    "tidalmq_broker.local.cluster",
    "importlib.metadata",
)
# what `reassign` does not need either: the other commands' modules, cryptography (the control
# plane's certificates: `local` commands load them, tidalmq_core.control_tls), the metadata model
# (the controller's half of tidalmq_core.reassignment), and for a plaintext connection ssl,
# SCRAM and the IDNA codec
NOT_REASSIGN = (
    "cryptography",
    "ssl",
    "tidalmq_core.metadata",
    "tidalmq_core.scram",
    "encodings.idna",  # getaddrinfo's codec for a str host (admin_client._host)
    "tidalmq_broker.local",
    "tidalmq_broker.static_topics",
    "tidalmq_broker.serve",
    "tidalmq_broker.tuning",
    # a plaintext connection reads no client properties; argparse's help formatter finds the
    # terminal's width without shutil
    "tidalmq_core.client_properties",
    "shutil",
)
# nor, to submit, verify or list moves, dataclasses (it imports inspect, ast, dis, tokenize):
# with the two above ~12 ms of a move's time from the command's start. (--generate plans with
# tidalmq_core.balance, whose records are dataclasses.)
NOT_TO_MOVE = ("dataclasses", "inspect", "pathlib")


def modules_after(code: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    return run_fresh(code, tmp_path)[1]


def run_fresh(code: str, tmp_path: Path) -> tuple[list[str], set[str]]:
    """What `code` prints in a fresh interpreter, and the modules that holds afterwards."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"TIDALMQ_DATA_DIR": str(tmp_path / "no-cluster"), "PATH": "/usr/bin:/bin"},
    )
    *printed, modules = out.stdout.strip().splitlines()
    return printed, set(json.loads(modules))


def heavy_in(modules: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


def run_cli(*argv: str, exit_code: bool = False) -> str:
    """Code that runs the command line quietly; `exit_code`: then prints its exit status."""
    code = (
        "import contextlib, io\nfrom tidalmq_broker.cli import main\nstatus = None\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        status = main({list(argv)!r})\n    except SystemExit:\n        pass"
    )
    return code + ("\nprint(f'exit {status}')" if exit_code else "")


# ------------------------------------------------------------------------- what is imported
def test_help_and_local_commands_import_nothing_heavy(tmp_path: Path) -> None:
    """`tidalmq local status` (here: finding no cluster) and the parser of every built-in
    command: stdlib, the CLI modules and the core's small modules only."""
    for code in (
        "import tidalmq_broker.cli",
        run_cli("local", "status"),
        run_cli("local", "status", "--help"),
        run_cli("reassign", "--help"),
        "from tidalmq_broker.cli import build_parser\nbuild_parser('local')\n"
        "import tidalmq_broker.local.client",
    ):
        assert heavy_in(modules_after(code, tmp_path)) == [], code


def test_a_whole_reassign_imports_nothing_heavy(tmp_path: Path) -> None:
    """`tidalmq reassign --execute --wait`, `--verify`, `--generate` and `--list` run to the end
    against a broker (this process, answering with the broker's codec) and import none of
    HEAVY nor the other commands' modules: the command's start is most of a 1 GiB move's time
    from the user's point of view ([L1] item 5, docs/cli.md)."""
    plan = tmp_path / "plan.json"
    plan.write_text(
        '{"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": [1]}]}'
    )
    topics = tmp_path / "topics.json"
    topics.write_text('{"version": 1, "topics": [{"topic": "orders"}]}')
    # what the interpreter's start imports (an editable install's import hook imports pathlib,
    # a user's install does not) is not the command's doing
    started = modules_after("pass", tmp_path)
    with FakeBroker() as broker:
        for mode in (
            ["--execute", "--wait", "--reassignment-json-file", str(plan)],
            ["--verify", "--reassignment-json-file", str(plan)],
            ["--generate", "--topics-to-move-json-file", str(topics), "--broker-list", "0,1"],
            ["--list"],
        ):
            code = run_cli("reassign", "--bootstrap-server", broker.address, *mode, exit_code=True)
            printed, modules = run_fresh(code, tmp_path)
            assert printed == ["exit 0"], mode
            assert "tidalmq_broker.admin_client" in modules, mode  # it did talk to the broker
            not_wanted = HEAVY + NOT_REASSIGN + (() if "--generate" in mode else NOT_TO_MOVE)
            assert heavy_in(modules - started, not_wanted) == [], mode
        assert {45, 46, 3} <= broker.apis_seen


# what a broker of a cluster (its controller elsewhere) never needs: the controller itself, its
# managers, its metadata log and its server (a third of the broker's start before [M1]'s
# lazy facade: every add-broker and every pod start pays it)
CONTROLLER_ITSELF = (
    "tidalmq_controller._controller",
    "tidalmq_controller._rpc_server",
    "tidalmq_controller._broker_lifecycle",
)


def reassign_orders_0(broker: FakeBroker, mode: str, *, target: int) -> int:
    """`tidalmq reassign MODE` in this process, with a plan moving orders-0 to `target`."""
    plan = {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": [target]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(plan, f)
        f.flush()
        args = ["--bootstrap-server", broker.address, "--reassignment-json-file", f.name]
        return cli.main(["reassign", mode, *args])


def test_execute_checks_the_plan_and_prints_the_rollback_from_one_metadata_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`reassign --execute` sends one Metadata request (it names the brokers, the plan's
    partitions and their replicas) and then the reassignment: each extra round trip is on the
    path from the command's start to the move's (docs/cli.md)."""
    with FakeBroker() as broker:
        code = reassign_orders_0(broker, "--execute", target=0)
    assert code == 0
    assert broker.requests == [3, 45]  # Metadata, AlterPartitionReassignments
    out = capsys.readouterr().out
    assert '"replicas": [1]' in out  # the rollback plan: where orders-0 is now
    assert "Successfully started partition reassignment for orders-0" in out


def test_verify_reads_replicas_leaders_and_brokers_from_one_metadata_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`reassign --verify`: the plan's check, the moves in flight, then one Metadata request
    for replicas, leaders and brokers (one snapshot, not three requests that a move could
    straddle)."""
    with FakeBroker() as broker:
        code = reassign_orders_0(broker, "--verify", target=1)
    assert code == 0
    assert broker.requests == [3, 46, 3]  # Metadata, ListPartitionReassignments, Metadata
    assert "Reassignment of partition orders-0 is completed" in capsys.readouterr().out


def test_a_broker_loads_the_controllers_client_but_not_the_controller(tmp_path: Path) -> None:
    """What `tidalmq broker` imports to serve (local/spare_process.py loads the same), then the names
    a broker uses from the facade: the client and the records' types."""
    modules = modules_after(
        "from tidalmq_broker.local.spare_process import _load\n_load()\n"
        "from tidalmq_controller import HttpControllerClient, Heartbeat, NewTopic, report_doc\n"
        "from tidalmq_broker.broker import Broker",
        tmp_path,
    )
    assert "tidalmq_controller._rpc_client" in modules  # the guard can see the package
    assert heavy_in(modules, CONTROLLER_ITSELF) == []
    # the facade still gives the controller to a process that hosts one
    hosting = modules_after("from tidalmq_controller import Controller", tmp_path)
    assert "tidalmq_controller._controller" in hosting


def test_the_guard_sees_a_heavy_import(tmp_path: Path) -> None:
    """The guard above can fail: the generic call() still brings the codec."""
    code = "from tidalmq_broker.admin_client import AdminClient\nAdminClient.call  # noqa\n"
    code += "import tidalmq_broker.protocol.codec"
    assert "kio" in heavy_in(modules_after(code, tmp_path))


class FakeBroker:
    """A broker of one topic (orders, partition 0 on broker 1 of brokers 0 and 1) that answers
    Metadata, AlterPartitionReassignments and ListPartitionReassignments, on a thread."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.apis_seen: set[int] = set()
        self.requests: list[int] = []  # the api key of every request, in order
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeBroker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        while True:
            head = conn.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return
            (size,) = struct.unpack(">i", head)
            frame = conn.recv(size, socket.MSG_WAITALL)
            api_key, version, correlation_id = peek_header(frame)
            self.apis_seen.add(api_key)
            self.requests.append(api_key)
            conn.sendall(encode_response(api_key, version, correlation_id, FAKE_ANSWERS[api_key]))


FAKE_ANSWERS: dict[int, dict[str, Any]] = {
    3: {
        "throttle_time": 0,
        "brokers": [
            {"node_id": 0, "host": "127.0.0.1", "port": 1, "rack": None},
            {"node_id": 1, "host": "127.0.0.1", "port": 2, "rack": None},
        ],
        "cluster_id": "c",
        "controller_id": 0,
        "topics": [
            {
                "error_code": 0,
                "name": "orders",
                "topic_id": uuid.UUID(int=1),
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": 0,
                        "partition_index": 0,
                        "leader_id": 1,
                        "leader_epoch": 1,
                        "replica_nodes": [1],
                        "isr_nodes": [1],
                        "offline_replicas": [],
                    }
                ],
                "topic_authorized_operations": -2147483648,
            }
        ],
    },
    45: {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "responses": [
            {
                "name": "orders",
                "partitions": [{"partition_index": 0, "error_code": 0, "error_message": None}],
            }
        ],
    },
    46: {"throttle_time": 0, "error_code": 0, "error_message": None, "topics": []},
}


def test_help_lists_the_plugins_and_a_builtin_command_does_not_read_them() -> None:
    names = _subcommands(cli.build_parser(None))
    assert {"operator", "plan"} <= set(names)
    assert set(_subcommands(cli.build_parser("local"))) == BUILTIN_NAMES
    assert cli.chosen_command(["--version"]) is None
    assert cli.chosen_command(["local", "status"]) == "local"


# ----------------------------------------------------------------------------- --help format
def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _all_parsers(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, Any]]:
    found = [(name, parser)]
    for sub_name, sub in _subcommands(parser).items():
        found += _all_parsers(sub, f"{name} {sub_name}")
    return found


def test_every_option_with_a_default_shows_it_in_help() -> None:
    parsers = _all_parsers(cli.build_parser(every=True), "tidalmq")  # the broker's flags too
    formatter = HelpFormatter("tidalmq")
    missing = []
    for name, parser in parsers:
        assert parser.formatter_class is HelpFormatter, name
        for action in parser._actions:
            if not action.option_strings or action.default in (None, False, "", [], "==SUPPRESS=="):
                continue
            shown = formatter._get_help_string(action)
            if "default" not in shown.lower():
                missing.append(f"{name} {action.option_strings[0]}")
    assert missing == []
    local_up = dict(parsers)["tidalmq local up"].format_help()
    assert "(default: 9690)" in local_up and "(default: 127.0.0.1)" in local_up


def test_output_json_is_on_every_command_that_prints_a_document() -> None:
    parsers = dict(_all_parsers(cli.build_parser(every=True), "tidalmq"))
    for name in (
        "local status",
        "local add-broker",
        "local remove-broker",
        "local kill-broker",
        "reassign",
        "static-topic describe",
        "static-topic list",
        "recover",
        "plan",
    ):
        parser = parsers[f"tidalmq {name}"]
        output = next(a for a in parser._actions if a.dest == "output")
        assert output.default == "text" and "json" in output.choices, name
        assert "--output json prints one JSON document" in parser.format_help(), name


# ------------------------------------------------------------------------- malformed input
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1", "127.0.0.1: not HOST:PORT (e.g. 127.0.0.1:9092)"),
        ("localhost:", "localhost:: not HOST:PORT (e.g. 127.0.0.1:9092)"),
        ("host:port", "host:port: not HOST:PORT (e.g. 127.0.0.1:9092)"),
        ("host:70000", "host:70000: port 70000 is not between 1 and 65535"),
    ],
)
def test_a_malformed_address_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        split_address(text)
    assert str(raised.value) == message
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        bootstrap_servers(f"127.0.0.1:9092,{text}")
    assert str(refused.value) == message


def test_the_url_flags_default_to_not_given() -> None:
    """argparse runs a string default through the type: an empty one must pass."""
    parser = cli.build_parser(every=True)
    assert parser.parse_args(["recover"]).controller_url == ""
    assert parser.parse_args(["static-topic", "list"]).controller_url in (None, "")


def test_good_addresses() -> None:
    assert http_url("http://prometheus") == "http://prometheus"  # the scheme's port
    assert split_address("[::1]:9092") == ("::1", 9092)
    assert split_address(":9092") == ("localhost", 9092)
    assert bootstrap_servers(" a:1, b:2 ,") == "a:1,b:2"
    assert http_url("http://127.0.0.1:9690/") == "http://127.0.0.1:9690"
    assert id_list("0, 2,3") == [0, 2, 3]


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (http_url, "127.0.0.1:9690", "'127.0.0.1:9690' is not a URL like http://127.0.0.1:9690"),
        (
            http_url,
            "http://host:port",
            "'http://host:port' is not a URL like http://127.0.0.1:9690",
        ),
        (id_list, "0,x", "'x' is not an id (expected e.g. 0,1,2)"),
        (id_list, ",", "no ids given (expected e.g. 0,1,2)"),
    ],
)
def test_malformed_urls_and_id_lists_are_one_line(kind: Any, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        kind(text)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["reassign", "--list", "--bootstrap-server", "127.0.0.1"],
            "error: argument --bootstrap-server: 127.0.0.1: not HOST:PORT (e.g. 127.0.0.1:9092)",
        ),
        (["recover", "--partitions", "0,a"], "error: argument --partitions: 'a' is not an id"),
        (
            ["static-topic", "list", "--controller-url", "localhost:9690"],
            "error: argument --controller-url: 'localhost:9690' is not a URL",
        ),
        (
            ["static-topic", "create", "t", "--queues", "2", "--brokers", "1,b"],
            "error: argument --brokers: 'b' is not an id",
        ),
    ],
)
def test_the_command_line_names_the_flag_of_a_malformed_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"version": 1}', 'expected {"version": 1, "topics": [{"topic": "NAME"}, ...]}'),
        ('{"topics": [{"name": "t"}]}', 'topics[0] has no "topic"'),
    ],
)
def test_topics_to_move_messages(text: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        topics_to_move(text)
    assert message in str(raised.value)
    assert topics_to_move('{"version": 1, "topics": [{"topic": "a"}, {"topic": "b"}]}') == [
        "a",
        "b",
    ]


# ------------------------------------------------------------------------------ --verify
def test_verify_says_when_the_target_broker_is_gone() -> None:
    tp = TopicPartition("t", 0)
    entry = PlanEntry(tp, 3)
    brokers = {0, 1, 2}
    assert verify_status(entry, {}, [1], 1, brokers) == "target_gone"
    assert verify_status(entry, {}, [1], 1, brokers | {3}) == "not_started"
    assert verify_status(entry, {tp: ([1], [3], [1])}, [1], -1, brokers | {3}) == "in_progress"
    assert verify_status(entry, {}, [3], -1, brokers | {3}) == "opening"
    assert verify_status(entry, {}, [3], 3, brokers | {3}) == "completed"


# ------------------------------------------------------------- add-broker / remove-broker
def test_move_count_never_goes_back_and_grows_with_new_moves() -> None:
    moves = MoveCount()
    moves.update(0, 4)
    moves.update(3, 1)
    assert (moves.done, moves.total) == (3, 4)
    moves.update(2, 3)  # a count read a moment earlier: done stays
    assert (moves.done, moves.remaining, moves.total) == (3, 3, 6)


def test_change_result_json_and_text() -> None:
    done = ChangeResult("added", 3, MoveCount(4, 0), True, 1.25, 120.0, "127.0.0.1:9095")
    assert done.to_json() == {
        "broker": 3,
        "address": "127.0.0.1:9095",
        "finished": True,
        "moves": {"done": 4, "total": 4},
        "elapsed_s": 1.25,
    }
    assert done.describe() == "broker 3 added on 127.0.0.1:9095: 4 partitions moved onto it in 1.2s"
    late = ChangeResult("added", 3, MoveCount(1, 3), False, 5.0, 5.0)
    assert late.describe() == (
        "broker 3 added, but 3 of 4 partition moves onto it not finished after 5s; they go on in "
        "the background (`tidalmq local status` shows them)"
    )
    json.dumps(late.to_json())


def test_progress_line_and_its_log_form() -> None:
    assert line(3, 4, 2.0) == (
        "[######################--------] 3/4 partitions moved (2.0s, 1.5/s)"
    )
    assert line(0, 0, 0.1).startswith("[" + "#" * 30 + "] 0/0")
    out = io.StringIO()  # not a terminal: one line per change, at most one a second
    progress = Progress(out, "partitions moved onto it")
    progress.show(0, 4)
    progress.show(1, 4)  # within the second: not printed
    progress.show(4, 4)  # the last: printed
    progress.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "0/4" in lines[0] and "4/4 partitions moved onto it" in lines[1]
    assert "\r" not in out.getvalue()
