"""The control-plane token of the local cluster, and how the commands that call a controller
find the controller and its token (docs/security.md, "The control plane").

`tidalmq local up` makes `<data dir>/control-token` at its first start (a random token, mode
0600, kept across restarts; `--fresh` makes a new one). Its controller accepts it as the
cluster's control token, and each broker process it starts is given only its own broker token
derived from it (TIDALMQ_CONTROL_TOKEN), so that a broker can act for no other broker.

The commands that call the controller over HTTP (`local status | add-broker | remove-broker |
kill-broker`, `recover`, `static-topic ...`) read that file when they find the controller through
the data dir, so they work unchanged. Given `--controller-url` (a controller elsewhere), they take
`--control-token-file`, else TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN, else the data
dir's token.

With control-plane mTLS (the local cluster's default, local/control_tls.py) they also present a
client certificate: the data dir's `control-tls/admin.pem` when they find the controller through
the data dir, else TIDALMQ_CONTROL_TLS_CERT_FILE, _KEY_FILE and _CA_FILE, else the data dir's.

Stdlib and tidalmq_core only: these commands start fast.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

from tidalmq_core.control_auth import (
    TokenError,
    authorization,
    generate_token,
    read_tokens,
    tokens_from_env,
)
from tidalmq_core.control_tls import ControlTls, ControlTlsError, server_is_admin

from tidalmq_broker.local.control_tls import data_dir_tls
from tidalmq_broker.local.processes import STATE_NAME, resolve_data_dir

TOKEN_NAME = "control-token"


class ControlError(Exception):
    """A one-line message for the user."""


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_NAME


def ensure_token(data_dir: Path) -> str:
    """The data dir's control token, made (mode 0600) when there is none yet."""
    path = token_path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)  # readable by its owner only, whatever made it
    else:
        with os.fdopen(fd, "w") as out:
            out.write(generate_token() + "\n")
    try:
        return read_tokens(file=str(path), what=str(path))[0]
    except TokenError as exc:
        raise ControlError(f"{exc} (delete it: `local up` makes a new one)") from exc


def data_dir_token(data_dir: Path) -> str:
    """The token of a running local cluster's data dir."""
    path = token_path(data_dir)
    try:
        return read_tokens(file=str(path), what="the local cluster's control token")[0]
    except TokenError as exc:
        raise ControlError(str(exc)) from exc


class Target(NamedTuple):
    """A controller a command calls: its URL, the control token, the client certificate
    (control-plane mTLS; None: plain HTTP)."""

    url: str
    token: str
    tls: ControlTls | None = None


def find_controller(
    controller_url: str | None, data_dir: str | Path | None, token_file: str = ""
) -> Target:
    """The controller of a command: --controller-url with --control-token-file or the
    environment's token (and TLS files), else the local cluster of `data_dir` (empty: the
    default data dir, local/processes.py) with its token and certificate."""
    data = resolve_data_dir(data_dir)
    try:
        if token_file:
            explicit = read_tokens(file=token_file)[0]
        elif controller_url:
            explicit = next(iter(tokens_from_env()), "")
        else:
            explicit = ""
        tls = (ControlTls.from_env() if controller_url else None) or data_dir_tls(data)
    except (TokenError, ControlTlsError) as exc:
        raise ControlError(str(exc)) from exc
    if controller_url:
        if explicit:
            return Target(controller_url.rstrip("/"), explicit, tls)
        if token_path(data).exists():
            return Target(controller_url.rstrip("/"), data_dir_token(data), tls)
        raise ControlError(
            "no control token: give --control-token-file, or set TIDALMQ_CONTROL_TOKEN_FILE or "
            "TIDALMQ_CONTROL_TOKEN (on Kubernetes: the chart's Secret, key admin-token)"
        )
    state_file = data / STATE_NAME
    try:
        url = str(json.loads(state_file.read_text())["controller_url"])
    except FileNotFoundError:
        raise ControlError(
            f"no local cluster is running (no {state_file}); start one with `tidalmq local up`, "
            "or name the data dir of the one running (--data-dir or TIDALMQ_DATA_DIR)"
        ) from None
    except (OSError, ValueError, KeyError) as exc:
        raise ControlError(f"cannot read {state_file}: {exc}") from exc
    return Target(url.rstrip("/"), explicit or data_dir_token(data), tls)


def request(
    base: str,
    path: str,
    token: str,
    body: dict[str, Any] | None = None,
    *,
    method: str = "POST",
    timeout_s: float = 60.0,
    tls: ControlTls | None = None,
) -> Any:
    """Call the controller (over HTTPS with `tls`'s client certificate when `base` is https);
    its JSON answer. A refused token or certificate or an unreachable controller raise
    ControlError; another HTTP error is raised as it is (the caller reads its body)."""
    data = None if method == "GET" else json.dumps(body or {}).encode()
    req = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **authorization(token)},
    )
    context = None
    if base.startswith("https:"):
        if tls is None:
            raise ControlError(
                f"the controller at {base} speaks mTLS: give TIDALMQ_CONTROL_TLS_CERT_FILE, "
                "TIDALMQ_CONTROL_TLS_KEY_FILE and TIDALMQ_CONTROL_TLS_CA_FILE (an admin's "
                "certificate of the cluster CA)"
            )
        try:
            context = tls.client_context(server_is_admin)  # the controller's certificate
        except ControlTlsError as exc:
            raise ControlError(str(exc)) from exc
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            try:
                why = ": " + str(json.loads(exc.read())["error"])
            except (ValueError, KeyError, TypeError, OSError):
                why = ""
            raise ControlError(
                f"the controller at {base} refused the call ({exc.code}{why}): use the "
                "cluster's control token (and an admin's certificate)"
            ) from None
        raise
    except (urllib.error.URLError, OSError) as exc:
        raise ControlError(f"cannot reach the controller at {base}: {exc}") from exc
