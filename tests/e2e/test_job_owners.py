"""A named job's app id belongs to its owner, on the real server with SASL users and ACLs: a
second principal can neither read its blocks, share its version nor fence it, whether or not
an ACL lets it write app ids, and a refused request writes nothing. The Spark driver's own
call (``allocate_named``, credentials as the sink passes them) is what the owner runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from ops.testing.serverproc import FREQUENT_SNAPSHOTS, ServerProcess, add_sasl_user
from pidctl.client import SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.records import JobBlockRecorded
from pidctl.controller.log.recovery import read_log
from pidctl.protocol import requests
from pidctl.spark import kafka_driver
from pidctl.spark.allocation import JobAllocation, PreallocationError


def allocate_named(
    bootstrap: str, count: int, app: str, version: int, **client: Any
) -> JobAllocation:
    """The driver's named allocation (``kafka_driver.allocate_named``) with the credentials
    as the sink passes them; a refusal is not asked again."""
    named = kafka_driver.allocate_named(
        bootstrap, count, app, version, connection=client, budget_s=5
    )
    return named.allocation


PASSWORDS = {"etl": "etl-pw", "intruder": "intruder-pw", "nobody": "nobody-pw"}
ACLS = [
    # The owner may write its team's app ids; the intruder every app id (an ACL is not
    # ownership); "nobody" has no ACL for app ids, only what an idempotent producer has.
    {
        "principal": "User:etl",
        "operation": "Write",
        "resource_type": "AppId",
        "resource_name": "etl-",
        "pattern_type": "prefixed",
    },
    {
        "principal": "User:intruder",
        "operation": "Write",
        "resource_type": "AppId",
        "resource_name": "*",
    },
    {"principal": "User:nobody", "operation": "IdempotentWrite", "resource_type": "Cluster"},
]
DENIED = ErrorCode.transactional_id_authorization_failed
APP = "etl-orders"


@dataclass
class Secured:
    server: ServerProcess
    bootstrap: str

    def sasl(self, user: str) -> tuple[str, str, str]:
        return ("SCRAM-SHA-256", user, PASSWORDS[user])

    def blocks(self, user: str, version: int, blocks: range) -> list[tuple[int, int, int]]:
        """(error, start, length) of these blocks of the version, asked as ``user``."""
        keys = [JobKey(APP, version, block).client_id() for block in blocks]
        with SyncClient(self.bootstrap, sasl=self.sasl(user)) as client:
            answers = client.pipeline([requests.allocate(-1, -1)] * len(keys), keys)
        return [(a.error_code, a.producer_id_start, a.producer_id_len) for a in answers]

    def records(self) -> list[object]:
        return [entry.record for entry in read_log(self.server.data_dir).entries()]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    for user, password in PASSWORDS.items():
        add_sasl_user(tmp_path / "users.json", user, password)
    lines = [
        'listeners = "SASL_PLAINTEXT://127.0.0.1:0"',
        f"credentials_file = {json.dumps(str(tmp_path / 'users.json'))}",
        'authorizer = "acl"',
    ]
    for acl in ACLS:
        lines.append("[[acls]]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in acl.items())
    config = tmp_path / "pidctl.toml"
    config.write_text("\n".join(lines) + "\n")
    server = ServerProcess(
        tmp_path / "data",
        "--config",
        str(config),
        "--snapshot-interval-records",
        "5",
        *FREQUENT_SNAPSHOTS,
    )
    with server:
        yield Secured(server, f"127.0.0.1:{server.ports[0]}")


def test_a_second_principal_can_neither_read_share_nor_fence_an_app_id(
    secured: Secured,
) -> None:
    owned = allocate_named(secured.bootstrap, 2500, APP, 5, sasl=secured.sasl("etl"))
    assert len(owned.blocks) == 3
    before = secured.records()
    # Read (a re-run), share (a block more), fence (a newer version, the largest one): each
    # refused as a principal without an ACL is, whether its ACL allows the app id or not.
    for user in ("intruder", "nobody"):
        assert [e for e, _, _ in secured.blocks(user, 5, range(3))] == [DENIED] * 3
        assert secured.blocks(user, 5, range(3, 4))[0][0] == DENIED
        assert secured.blocks(user, 6, range(1))[0][0] == DENIED
        assert secured.blocks(user, 2**63 - 1, range(1))[0][0] == DENIED
        with pytest.raises(PreallocationError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            allocate_named(secured.bootstrap, 10, APP, 7, sasl=secured.sasl(user))
    assert secured.records() == before  # nothing a refused request asked was written
    # The owner's re-run: the same blocks; across a SIGKILL and a restart (the owner is in
    # the log and in snapshots) too.
    assert allocate_named(secured.bootstrap, 2500, APP, 5, sasl=secured.sasl("etl")) == owned
    secured.server.kill()
    secured.server.start()
    secured.bootstrap = f"127.0.0.1:{secured.server.ports[0]}"
    assert secured.blocks("intruder", 5, range(1))[0][0] == DENIED
    assert allocate_named(secured.bootstrap, 2500, APP, 5, sasl=secured.sasl("etl")) == owned
    # The owner alone moves its app on, which fences the older version for it.
    newer = allocate_named(secured.bootstrap, 10, APP, 6, sasl=secured.sasl("etl"))
    assert newer.blocks[0][0] > max(first for first, _ in owned.blocks)
    assert secured.blocks("etl", 5, range(1))[0][0] == ErrorCode.producer_fenced
    recorded = [r for r in secured.records() if isinstance(r, JobBlockRecorded)]
    assert {r.principal for r in recorded} == {"User:etl"}


def test_an_app_id_outside_the_owners_acl_is_refused_and_its_name_stays_free(
    secured: Secured,
) -> None:
    """etl may not write "other-" app ids; its refusal records nothing, so the app id is
    still free for a principal whose ACL allows it."""
    before = secured.records()
    with pytest.raises(PreallocationError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        allocate_named(secured.bootstrap, 10, "other-app", 1, sasl=secured.sasl("etl"))
    assert secured.records() == before
    theirs = allocate_named(secured.bootstrap, 10, "other-app", 1, sasl=secured.sasl("intruder"))
    assert len(theirs.blocks) == 1
