"""The `pidctl` command line as a user runs it, against real data dirs."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ops.testing.serverproc import ServerProcess, format_data_dir
from pidctl.client import SyncClient
from pidctl.controller.log.datadir import RESERVATION_NEXT_FILE
from tests import wire


def pidctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _grants(tmp_path: Path, count: int) -> tuple[Path, list[int], int]:
    """A data dir where broker 1 registered and got ``count`` blocks: (dir, starts, epoch)."""
    data_dir = tmp_path / "data"
    with ServerProcess(data_dir) as server:
        with SyncClient(server.bootstrap) as client:
            epoch = wire.register(client, 1, server.cluster_id())
            starts = [
                r.producer_id_start
                for r in client.pipeline([wire.allocate(1, epoch) for _ in range(count)])
            ]
        assert server.terminate() == 0
    return data_dir, starts, epoch


def _segment(data_dir: Path) -> Path:
    return sorted(data_dir.glob("*.log"))[-1]


def _digest(data_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data_dir.iterdir()}


def test_dump_json_is_the_audit_trail(tmp_path: Path) -> None:
    data_dir, starts, epoch = _grants(tmp_path, 3)
    result = pidctl("log", "dump", "--data-dir", str(data_dir), "--json")
    assert result.returncode == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["type"] for r in records] == [
        "ClusterCreated",
        "ControllerStarted",
        "BrokerRegistered",
        "ProducerIdsReserved",  # ahead of the first grant, and of the next 99
        *["ProducerIdsGranted"] * 3,
        "ProducerIdsReserved",  # released by the clean stop: the next start skips nothing
    ]
    assert [r["offset"] for r in records] == list(range(8))
    assert records[-1]["next_producer_id"] == records[-2]["next_producer_id"]
    assert records[2]["broker_epoch"] == epoch == 2  # the registration record's offset
    grants = [r for r in records if r["type"] == "ProducerIdsGranted"]
    assert [g["first_producer_id"] for g in grants] == starts
    assert all(g["broker_id"] == 1 and g["broker_epoch"] == epoch for g in grants)
    assert all(g["holder"] == "broker" and g["principal"] == "User:ANONYMOUS" for g in grants)
    assert all(g["time"].endswith("Z") for g in records)
    text = pidctl("log", "dump", "--data-dir", str(data_dir))
    assert "ProducerIdsGranted" in text.stdout and text.returncode == 0


def test_verify_ok_and_missing_dir(tmp_path: Path) -> None:
    data_dir, _, _ = _grants(tmp_path, 2)
    ok = pidctl("log", "verify", "--data-dir", str(data_dir))
    assert ok.returncode == 0 and ok.stdout.strip().endswith("OK")
    missing = pidctl("log", "verify", "--data-dir", str(tmp_path / "nope"))
    assert missing.returncode == 1


def test_torn_tail_is_truncated_at_start_up_with_a_warning(tmp_path: Path) -> None:
    data_dir, starts, epoch = _grants(tmp_path, 5)
    segment = _segment(data_dir)
    data = segment.read_bytes()
    starts, position = [], 0
    while position < len(data):  # each record's u32 length says where the next begins
        starts.append(position)
        position += 8 + struct.unpack_from(">I", data, position)[0]
    # The last record is the reservation's release (a clean stop); cut the grant before it
    # mid-record, as a disk losing its tail would.
    segment.write_bytes(data[: starts[-2] + 20])
    verify = pidctl("log", "verify", "--data-dir", str(data_dir))
    # A cut record may have been acknowledged: verify cannot call that OK.
    assert verify.returncode == 1 and "DAMAGED TAIL" in verify.stdout
    with ServerProcess(data_dir) as server:
        warning = server.event("truncating torn tail")
        assert warning["level"] == "warning" and warning["bytes"] > 0
        with SyncClient(server.bootstrap) as client:
            nxt = client.request(wire.allocate(1, epoch))
    # We cut a record ourselves (as a disk losing its tail would): that grant is gone from
    # the log, and its range is never granted again (grants go on above the reservation).
    assert nxt.producer_id_start >= starts[-1] + 1000
    assert pidctl("log", "verify", "--data-dir", str(data_dir)).returncode == 0


def test_corruption_in_the_middle_stops_start_up_and_touches_nothing(tmp_path: Path) -> None:
    data_dir, _, _ = _grants(tmp_path, 5)
    segment = _segment(data_dir)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    before = _digest(data_dir)

    verify = pidctl("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 1 and "CORRUPT" in verify.stdout
    serve = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "serve",
            "--data-dir",
            str(data_dir),
            "--metrics-listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 1
    last_line = serve.stderr.strip().splitlines()[-1]
    assert last_line.startswith("pidctl: ") and segment.name in last_line
    assert "corrupt record" in last_line
    before.pop(".lock", None)
    after = _digest(data_dir)
    after.pop(".lock", None)
    assert after == before


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--node-id", "x"], {}, "--node-id: invalid node_id"),
        (["--listen", "nohost"], {}, "--listen: invalid listen"),
        ([], {"PIDCTL_NO_SUCH_THING": "1"}, "PIDCTL_NO_SUCH_THING: unknown setting"),
        # Named like a Kubernetes service link, but not shaped like one: a mistaken setting.
        ([], {"PIDCTL_PORT": "9093"}, "PIDCTL_PORT: unknown setting"),
        ([], {"PIDCTL_SERVICE_HOST": "pidctl.svc"}, "PIDCTL_SERVICE_HOST: unknown setting"),
        ([], {"PIDCTL_MAX_FRAME_BYTES": "0"}, "PIDCTL_MAX_FRAME_BYTES: invalid max_frame_bytes"),
        (["--first-producer-id", "10", "--last-producer-id", "5"], {}, "first_producer_id"),
        (["--pid-source", "http://127.0.0.1:2379/p"], {}, "--pid-source: invalid pid_source"),
        (["--pid-source", "etcd://127.0.0.1:2379"], {}, "names no key prefix"),
        (
            ["--pid-source", "etcd://e:1/p", "--pid-lease-size", "1500"],
            {},
            "pid_lease_size: must be a multiple of 1000",
        ),
        (["--pid-lease-prefetch-ratio", "0"], {}, "must be in (0, 1]"),
        (
            ["--pid-source", "etcd://e:1/p", "--last-producer-id", "99999"],
            {},
            "cannot be combined with pid_source",
        ),
        (["--etcd-certfile", "/nonexistent.pem", "--etcd-keyfile", "/nonexistent.pem"], {}, None),
    ],
)
def test_bad_settings_stop_start_up_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], names: str | None
) -> None:
    result = pidctl("serve", "--data-dir", str(tmp_path / "d"), *args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    if names is None:  # several problems: one line each
        assert all(line.startswith("pidctl: etcd_") for line in lines) and len(lines) == 2
        return
    assert len(lines) == 1 and names in lines[0], result.stderr


def test_config_file_env_and_flag_precedence(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text("first_producer_id = 10000\nlast_producer_id = 99999\nnode_id = 7\n")
    env = {"PIDCTL_FIRST_PRODUCER_ID": "20000"}
    with (
        ServerProcess(
            tmp_path / "d", "--config", str(config), "--last-producer-id", "20999", env=env
        ) as server,
        SyncClient(server.bootstrap) as client,
    ):
        epoch = wire.register(client, 1, server.cluster_id())
        first, second = client.pipeline([wire.allocate(1, epoch)] * 2)
    assert first.producer_id_start == 20000  # env beats the file
    assert second.error_code == -1  # the flag's last_producer_id beats the file's


def test_unknown_setting_in_config_file(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text("max_frame_byte = 10\n")
    result = pidctl("serve", "--config", str(config))
    assert result.returncode == 2 and "unknown setting 'max_frame_byte'" in result.stderr


def test_max_frame_bytes_setting_is_enforced(tmp_path: Path) -> None:
    from kio.schema.api_versions.v3 import ApiVersionsRequest

    from pidctl.protocol.codec import encode_request

    big = encode_request(
        ApiVersionsRequest(client_software_name="a" * 300, client_software_version="1"), 1, "c"
    )
    with ServerProcess(tmp_path / "d", "--max-frame-bytes", "256") as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(big)
            assert sock.recv(10) == b""
        small = ApiVersionsRequest(client_software_name="a", client_software_version="1")
        with SyncClient(server.bootstrap) as client:  # smaller frames are still served
            assert client.request(small).error_code == 0


def test_register_and_allocate_commands(server: ServerProcess) -> None:
    registered = pidctl(
        "register",
        "--bootstrap",
        server.bootstrap,
        "--broker-id",
        "4",
        "--cluster-id",
        server.cluster_id(),
    )
    assert registered.returncode == 0, registered.stderr
    epoch = registered.stdout.split()[-1]
    allocated = pidctl(
        "allocate", "--bootstrap", server.bootstrap, "--broker-id", "4", "--broker-epoch", epoch
    )
    assert allocated.stdout.strip() == "producer ids 0..999"
    refused = pidctl(
        "allocate", "--bootstrap", server.bootstrap, "--broker-id", "4", "--broker-epoch", "999"
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == "pidctl: allocation refused: stale_broker_epoch"


def test_connection_refused_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = pidctl(
        "allocate", "--bootstrap", f"127.0.0.1:{port}", "--broker-id", "1", "--broker-epoch", "1"
    )
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    format_data_dir(tmp_path / "d")
    before = _digest(tmp_path / "d")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = pidctl(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--listen",
            f"127.0.0.1:{port}",
        )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"pidctl: cannot listen on 127.0.0.1:{port}")
    )
    # The failed start wrote its ControllerStarted record and nothing else.
    records = pidctl("log", "dump", "--data-dir", str(tmp_path / "d"), "--json").stdout
    assert [json.loads(line)["type"] for line in records.splitlines()] == [
        "ClusterCreated",
        "ControllerStarted",
    ]
    # Besides the (empty) file the next reservation will be written into, opened ahead.
    assert set(_digest(tmp_path / "d")) - {RESERVATION_NEXT_FILE} == set(before)


def test_every_bad_setting_is_named_on_its_own_line(tmp_path: Path) -> None:
    result = pidctl(
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        "--node-id",
        "x",
        "--max-frame-bytes",
        "0",
        "--listeners",
        "SSL://127.0.0.1:0",
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert all(line.startswith("pidctl: ") for line in lines)
    assert any("node_id" in line for line in lines)
    assert any("max_frame_bytes" in line for line in lines)


def test_output_into_a_closed_pipe_stops_quietly(server: ServerProcess) -> None:
    # `true` exits without reading, long before pidctl has connected and prints.
    command = (
        f"{sys.executable} -m pidctl.controller.cli status --bootstrap {server.bootstrap} "
        "| true; exit ${PIPESTATUS[0]}"
    )
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")


def test_log_dump_shows_client_ids_escaped_so_none_forges_a_line_or_a_terminal_escape(
    tmp_path: Path,
) -> None:
    """`pidctl log dump` printed client ids raw: a newline in one forged a line of the audit
    trail an operator reads, and escape sequences reached the terminal."""
    data_dir = tmp_path / "data"
    forged_line = "\n         9  2030-01-01T00:00:00.000Z  ProducerIdsGranted     broker_id=7"
    hostile = [
        "spark-app" + forged_line,
        "\x1b]0;pwned\x07\x1b[2J\x1b[31mred",
        "a b holder=broker \u202eevil\r",
    ]
    with ServerProcess(data_dir) as server:
        with SyncClient(server.bootstrap) as client:
            answers = client.pipeline([wire.allocate(-1, -1)] * len(hostile), hostile)
        assert all(a.error_code == 0 for a in answers)
        assert server.terminate() == 0
    text = pidctl("log", "dump", "--data-dir", str(data_dir))
    records = pidctl("log", "dump", "--data-dir", str(data_dir), "--json").stdout.splitlines()
    assert text.returncode == 0
    lines = [line for line in text.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == len(records)  # a line per record, none forged
    assert "\x1b" not in text.stdout and "\r" not in text.stdout and "\u202e" not in text.stdout
    grants = [json.loads(r) for r in records if '"ProducerIdsGranted"' in r]
    assert [g["client_id"] for g in grants] == hostile  # --json: exactly what the log holds
    shown = [line for line in lines if "ProducerIdsGranted" in line]
    assert 'client_id="spark-app\\x0a         9  2030-01-01T00:00:00.000Z' in shown[0]
    assert 'client_id="a b holder=broker \\u202eevil\\x0d"' in shown[2]
    summary = pidctl("log", "dump", "--data-dir", str(data_dir), "--summary").stdout
    assert "\x1b" not in summary and 'job "spark-app\\x0a' in summary
