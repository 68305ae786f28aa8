"""SIGHUP never weakens what it cannot justify, and any error in it keeps the old
configuration: a real server, a real config file and credentials file, a real SIGHUP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ops.testing.serverproc import ServerProcess, add_sasl_user, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests.e2e.test_hostile import sasl_plaintext_server
from tests.wire import cluster_id_of

CLUSTER_DENIED = 31
TRANSACTIONAL_ID_DENIED = 53

CONFIG = """log_level = "info"
authorizer = "acl"
[[acls]]
principal = "User:ANONYMOUS"
operation = "IdempotentWrite"
resource_type = "Cluster"
"""


def _sighup(server: ServerProcess) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)


def _reload_outcome(server: ServerProcess, before: int) -> dict[str, object]:
    """The first reload outcome logged after the ``before``-th event."""
    outcomes = ("configuration reloaded", "reload refused", "reload failed")

    def found() -> list[dict[str, object]]:
        return [e for e in server.events[before:] if str(e.get("event", "")).startswith(outcomes)]

    wait_until(lambda: bool(found()), "the reload's outcome logged")
    return found()[0]


def _metric(server: ServerProcess, line_start: str) -> float:
    import httpx

    text = httpx.get(server.metrics_url + "/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


def _served_at_once(client: SyncClient, seconds: float) -> None:
    """For ``seconds``, InitProducerId after InitProducerId, each answered within 0.5 s."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        sent = time.monotonic()
        assert client.request(requests.init_producer_id()).error_code == 0
        assert time.monotonic() - sent < 0.5


@pytest.mark.parametrize(
    "written",
    ["", 'log_level = "info"\n'],
    ids=["empty", "cut-before-authorizer"],
)
def test_a_reload_that_would_switch_authorization_off_is_refused(
    tmp_path: Path, written: str
) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text(CONFIG)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        cluster = cluster_id_of(server.data_dir)
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.allocate(-1, -1)).error_code == 0  # a job: allowed
            assert client.request(requests.registration(1, cluster)).error_code == CLUSTER_DENIED
        config.write_text(written)  # an editor's in-place write, caught half done
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "reload refused; the previous configuration stays", outcome
        assert "authorizer" in str(outcome["reason"])
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.registration(1, cluster)).error_code == CLUSTER_DENIED
            tx = client.request(requests.init_producer_id("anyone's"))
            assert tx.error_code == TRANSACTIONAL_ID_DENIED
        assert _metric(server, 'pidctl_config_reloads_total{result="refused"}') == 1
        assert server.proc is not None and server.proc.poll() is None


@pytest.mark.parametrize(
    ("credentials", "says"),
    [
        ('{"users": []}', "failed"),
        ('{"users": {"alice": []}}', "failed"),
        ("{", "failed"),
        ('{"users": {}}', "refused"),
    ],
    ids=["users-a-list", "mechanisms-a-list", "cut", "no-users"],
)
def test_a_bad_or_empty_credentials_file_keeps_the_old_credentials(
    tmp_path: Path, credentials: str, says: str
) -> None:
    users = tmp_path / "users.json"
    with sasl_plaintext_server(tmp_path, "alice") as server:
        users.write_text(credentials)
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert str(outcome["event"]).startswith(f"reload {says}"), outcome
        assert server.proc is not None and server.proc.poll() is None  # still serving
        with SyncClient(server.bootstrap, sasl=("SCRAM-SHA-256", "alice", "alice-pw")) as client:
            assert client.request(requests.init_producer_id()).error_code == 0
        assert _metric(server, f'pidctl_config_reloads_total{{result="{says}"}}') == 1
        # A good file again: taken.
        users.unlink()
        add_sasl_user(users, "bob", "bob-pw")
        before = len(server.events)
        _sighup(server)
        assert _reload_outcome(server, before)["event"] == "configuration reloaded"
        with SyncClient(server.bootstrap, sasl=("SCRAM-SHA-256", "bob", "bob-pw")) as client:
            assert client.request(requests.init_producer_id()).error_code == 0
        assert json.loads(users.read_text())["users"].keys() == {"bob"}


#: ACLs as one array, each on a line of its own: what a reload takes (a file ending inside
#: an [[acls]] table is refused: it could be one cut while being written).
DENY_LAST = """log_level = "info"
authorizer = "acl"
acls = [
  { principal = "User:ANONYMOUS", operation = "IdempotentWrite", resource_type = "Cluster" },
  { principal = "User:ANONYMOUS", operation = "Write", resource_type = "TransactionalId", resource_name = "*" },
  { principal = "User:ANONYMOUS", operation = "Write", resource_type = "TransactionalId", resource_name = "payments", permission = "deny" },
]
"""  # noqa: E501


def test_a_reload_that_would_remove_a_deny_acl_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text(DENY_LAST)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id("orders")).error_code == 0
            denied = client.request(requests.init_producer_id("payments"))
            assert denied.error_code == TRANSACTIONAL_ID_DENIED
        # The deny entry removed (by an operator: a cut array does not parse).
        without_deny = "\n".join(line for line in DENY_LAST.splitlines() if "deny" not in line)
        config.write_text(without_deny + "\n")
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "reload refused; the previous configuration stays", outcome
        assert "DENY" in str(outcome["reason"])
        with SyncClient(server.bootstrap) as client:
            denied = client.request(requests.init_producer_id("payments"))
            assert denied.error_code == TRANSACTIONAL_ID_DENIED
        # Narrowing an allow only refuses more: applied.
        config.write_text(DENY_LAST.replace('resource_name = "*"', 'resource_name = "orders-*"'))
        before = len(server.events)
        _sighup(server)
        assert _reload_outcome(server, before)["event"] == "configuration reloaded"
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id("other")).error_code == (
                TRANSACTIONAL_ID_DENIED
            )


# -- a config file cut after each of its lines: never more access than before or after ----

#: Before: idempotent producers, and transactional ids "orders-..." from 127.0.0.1 only.
ACLS_BEFORE = [
    {
        "principal": "User:ANONYMOUS",
        "operation": "IdempotentWrite",
        "resource_type": "Cluster",
        "host": "127.0.0.1",
    },
    {
        "principal": "User:ANONYMOUS",
        "operation": "Write",
        "resource_type": "TransactionalId",
        "resource_name": "orders-",
        "pattern_type": "prefixed",
        "host": "127.0.0.1",
    },
]
#: After: every transactional id from 127.0.0.2, but "payments" from nowhere (a new DENY,
#: last: a cut before its permission line would read as an ALLOW, a cut before its table
#: would lose it; a cut before a host line would allow every host).
ACLS_AFTER = [
    *ACLS_BEFORE,
    {
        "principal": "User:ANONYMOUS",
        "operation": "Write",
        "resource_type": "TransactionalId",
        "resource_name": "*",
        "host": "127.0.0.2",
    },
    {
        "principal": "User:ANONYMOUS",
        "operation": "Write",
        "resource_type": "TransactionalId",
        "resource_name": "payments",
        "permission": "deny",
    },
]
HEADER = 'log_level = "info"\nauthorizer = "acl"\n'


def _as_tables(acls: list[dict[str, str]]) -> str:
    lines = [HEADER.rstrip("\n")]
    for acl in acls:
        lines.append("[[acls]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in acl.items()]
    return "\n".join(lines) + "\n"


def _as_array(acls: list[dict[str, str]]) -> str:
    entries = [
        "  { " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in acl.items()) + " },"
        for acl in acls
    ]
    return HEADER + "acls = [\n" + "\n".join(entries) + "\n]\n"


#: What each probe asks: no transactional id (IdempotentWrite), or one (Write on it).
PROBES = (None, "orders-1", "payments", "other")
HOSTS = ("127.0.0.1", "127.0.0.2")


def _access(server: ServerProcess) -> set[tuple[str, str | None]]:
    """The (host, transactional id) pairs allowed now."""
    allowed = set()
    for host in HOSTS:
        with SyncClient(server.bootstrap, source_address=(host, 0)) as client:
            for probe in PROBES:
                answer = client.request(requests.init_producer_id(probe))
                if answer.error_code not in (CLUSTER_DENIED, TRANSACTIONAL_ID_DENIED):
                    allowed.add((host, probe))
    return allowed


def _reload_with(server: ServerProcess, config: Path, text: str) -> str:
    config.write_text(text)  # an editor's write in place (truncate, write)
    before = len(server.events)
    _sighup(server)
    return str(_reload_outcome(server, before)["event"])


@pytest.mark.parametrize("form", [_as_tables, _as_array], ids=["tables", "array"])
def test_a_config_file_cut_after_any_line_never_gives_more_access_than_before_or_after(
    tmp_path: Path, form: Callable[[list[dict[str, str]]], str]
) -> None:
    """A config file cut mid-write (before an ACL's host line) parsed, and the SIGHUP
    applied an ALLOW for every host. Now a file ending inside an [[acls]] table is refused
    (a cut file cannot be told from a whole one there), and a cut array does not parse."""
    config = tmp_path / "pidctl.toml"
    config.write_text(_as_array(ACLS_AFTER))
    with ServerProcess(tmp_path / "after", "--config", str(config)) as server:
        after = _access(server)
    before_text = _as_array(ACLS_BEFORE)
    config.write_text(before_text)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        before = _access(server)
        assert before < after  # (the probes tell them apart)
        lines = form(ACLS_AFTER).splitlines(keepends=True)
        outcomes = []
        for cut in range(len(lines) + 1):
            outcome = _reload_with(server, config, "".join(lines[:cut]))
            outcomes.append(outcome)
            now = _access(server)
            assert now <= before | after, (cut, "".join(lines[:cut]), now - (before | after))
            if outcome == "configuration reloaded" and cut < len(lines):
                # (Fewer ACLs than before, never a DENY removed: back to before.)
                assert _reload_with(server, config, before_text) == "configuration reloaded"
        assert server.proc is not None and server.proc.poll() is None
    # The whole file: applied in the array form; a file ending in a table is refused.
    assert outcomes[-1] == (
        "configuration reloaded"
        if form is _as_array
        else "reload refused; the previous configuration stays"
    )


# -- files read off the event loop; SIGHUP at start-up; settings that take a restart --------


def test_a_credentials_file_on_a_hung_mount_holds_up_no_client(tmp_path: Path) -> None:
    """A credentials_file that blocks on open (a hung mount; here a named pipe with no
    writer, which blocks open(2) for real) stalled every client for as long: the reload
    read it on the event loop. Now it is read in a thread, under reload_timeout_ms."""
    credentials = tmp_path / "users.json"
    add_sasl_user(credentials, "alice", "alice-pw")
    server = ServerProcess(
        tmp_path / "d", "--credentials-file", str(credentials), "--reload-timeout-ms", "1000"
    )
    with server, SyncClient(server.bootstrap, timeout=5) as client:
        credentials.unlink()
        os.mkfifo(credentials)  # open() for reading now blocks until a writer comes
        before = len(server.events)
        _sighup(server)
        _served_at_once(client, 2.0)  # clients are served meanwhile
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "reload failed; the previous configuration stays"
        assert "reload_timeout_ms" in str(outcome["error"])
        # While that read hangs, another reload would hang the same way: refused at once.
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert "still reading" in str(outcome["error"])
        # The mount comes back: the hung read returns, and the next reload is taken.
        with open(credentials, "w") as pipe:  # (unblocks the reader)
            pipe.write('{"users": {}}')
        credentials.unlink()
        add_sasl_user(credentials, "bob", "bob-pw")

        def reloaded() -> bool:
            before = len(server.events)
            _sighup(server)
            return _reload_outcome(server, before)["event"] == "configuration reloaded"

        wait_until(reloaded, "a reload taken once the hung read returned")
        assert _metric(server, 'pidctl_config_reloads_total{result="failed"}') >= 2


def test_a_config_file_on_a_hung_mount_holds_up_no_client(tmp_path: Path) -> None:
    """The config file itself (with its ACLs) on a hung mount: a named pipe with no writer
    blocks open(2). Read in the reload's thread: clients are served meanwhile, the reload
    fails after reload_timeout_ms, and the access stays the one before."""
    config = tmp_path / "pidctl.toml"
    config.write_text('authorizer = "none"\n')
    server = ServerProcess(tmp_path / "d", "--config", str(config), "--reload-timeout-ms", "500")
    with server, SyncClient(server.bootstrap, timeout=5) as client:
        config.unlink()
        os.mkfifo(config)
        before = len(server.events)
        _sighup(server)
        _served_at_once(client, 1.5)
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "reload failed; the previous configuration stays"
        assert "reload_timeout_ms" in str(outcome["error"])
        with open(config, "w") as pipe:  # (the mount comes back: the read returns)
            pipe.write('authorizer = "none"\n')
        assert client.request(requests.init_producer_id()).error_code == 0


def _signals(pid: int, field: str) -> int:
    """A signal mask of /proc/PID/status (SigIgn, SigCgt); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith(f"{field}:"))
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(line.split()[1], 16)


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(line.split()[1])


def test_sighup_during_start_up_is_ignored(tmp_path: Path) -> None:
    """SIGHUP in the first ~0.3 s of start-up killed the process (its default action, before
    the server's signal watch ran). SIGHUPs are sent from the moment the process ignores
    SIGHUP, or has run a while (25 MB of imports: the interpreter itself is done), until it
    listens: it starts, and reloads once it can."""
    hup = 1 << (signal.SIGHUP - 1)
    server = ServerProcess(tmp_path / "d")
    formatted = ServerProcess(tmp_path / "d")  # (formatted first: start() does it too)
    formatted.start().kill()
    started: list[BaseException | None] = []

    def start() -> None:
        try:
            server.start()
            started.append(None)
        except BaseException as e:  # (for the test thread to see)
            started.append(e)

    starter = threading.Thread(target=start)
    starter.start()
    try:
        wait_until(lambda: server.proc is not None, "the process started")
        assert server.proc is not None
        pid = server.proc.pid
        wait_until(
            lambda: bool(_signals(pid, "SigIgn") & hup) or _rss_kib(pid) > 25_000,
            "the interpreter running the server's code",
            poll=0.001,
        )
        sent = 0
        while not started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)
                sent += 1
            time.sleep(0.005)
        starter.join()
        assert started == [None], started
        assert sent > 10
        assert server.proc.poll() is None
        # Once it listens, SIGHUP reloads.
        before = len(server.events)
        _sighup(server)
        assert _reload_outcome(server, before)["event"] == "configuration reloaded"
    finally:
        starter.join()
        server.kill()


def test_a_reload_names_the_settings_that_take_a_restart(tmp_path: Path) -> None:
    """A changed listeners was "reloaded" without a word that it needs a restart."""
    config = tmp_path / "pidctl.toml"
    config.write_text("max_connections = 500\n")
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        config.write_text(
            "max_connections = 400\n"
            'listeners = "PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"\n'
            'super_users = "User:ops"\n'
        )
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "configuration reloaded"
        restart = ["listeners", "max_connections"]
        assert sorted(str(name) for name in outcome["restart_needed"]) == sorted(restart)  # type: ignore[attr-defined]
        warning = next(
            e for e in server.events[before:] if "only after a restart" in str(e.get("event"))
        )
        assert sorted(warning["settings"]) == sorted(restart)
        assert server.ports == [server.port]  # still the one listener
