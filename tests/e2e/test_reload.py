"""SIGHUP never weakens what it cannot justify, and any error in it keeps the old
configuration: a real server, a real config file and credentials file, a real SIGHUP."""

from __future__ import annotations

import json
import signal
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


DENY_LAST = (
    CONFIG
    + """[[acls]]
principal = "User:ANONYMOUS"
operation = "Write"
resource_type = "TransactionalId"
resource_name = "*"
[[acls]]
principal = "User:ANONYMOUS"
operation = "Write"
resource_type = "TransactionalId"
resource_name = "payments"
permission = "deny"
"""
)


def test_a_reload_that_would_remove_a_deny_acl_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text(DENY_LAST)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id("orders")).error_code == 0
            denied = client.request(requests.init_producer_id("payments"))
            assert denied.error_code == TRANSACTIONAL_ID_DENIED
        # The editor's write caught after the allow entries, before the deny one.
        config.write_text(DENY_LAST[: DENY_LAST.rindex("[[acls]]")])
        before = len(server.events)
        _sighup(server)
        outcome = _reload_outcome(server, before)
        assert outcome["event"] == "reload refused; the previous configuration stays", outcome
        assert "DENY" in str(outcome["reason"])
        with SyncClient(server.bootstrap) as client:
            denied = client.request(requests.init_producer_id("payments"))
            assert denied.error_code == TRANSACTIONAL_ID_DENIED
        # Removing an allow only refuses more: applied.
        config.write_text(DENY_LAST.replace('resource_name = "*"', 'resource_name = "orders-*"'))
        before = len(server.events)
        _sighup(server)
        assert _reload_outcome(server, before)["event"] == "configuration reloaded"
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id("other")).error_code == (
                TRANSACTIONAL_ID_DENIED
            )
