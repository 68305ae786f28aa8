"""The check that the suite leaves the user's own server alone (ops/testing/user_server.py),
on free ports instead of the defaults: it passes a run that did not touch the server, fails
one that did, and its server does not outlive a killed run."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.coordination import free_port
from ops.testing.serverproc import wait_until
from ops.testing.user_server import UserServerCheck, port_free
from pidctl.client import SyncClient
from pidctl.protocol import requests

ROOT = Path(__file__).resolve().parents[3]


Address = tuple[str, int]


def _addresses() -> tuple[Address, Address]:
    """Free addresses for the check's listener and metrics, in place of the defaults."""
    return ("127.0.0.1", free_port()), ("127.0.0.1", free_port())


def _check(tmp_path: Path, addresses: tuple[Address, Address], play: bool) -> UserServerCheck:
    listen, metrics = addresses
    return UserServerCheck(play_user=play, listen=listen, metrics=metrics, checkout=tmp_path)


@pytest.fixture
def played(tmp_path: Path) -> Iterator[UserServerCheck]:
    """The check playing the user: `ops/dev.sh serve` with a block granted, running."""
    check = _check(tmp_path, _addresses(), play=True)
    check.start()
    try:
        assert check.proc is not None and check.proc.poll() is None
        assert check.before, "the played server's data dir has history"
        yield check
    finally:
        check.finish()


def test_a_run_that_leaves_the_server_alone_passes(played: UserServerCheck) -> None:
    directory = played.directory
    played.finish()
    assert not played.failed
    assert played.verdict.startswith("untouched: a real `ops/dev.sh serve`"), played.verdict
    assert played.proc is None and directory is not None and not directory.exists()


def test_a_run_that_talks_to_the_server_fails(played: UserServerCheck) -> None:
    with SyncClient("{}:{}".format(*played.listen)) as client:
        assert client.request(requests.init_producer_id()).error_code == 0
    played.finish()
    assert played.failed
    assert "FAILED: the suite touched" in played.verdict
    assert "1 connection(s) accepted" in played.verdict
    assert "data dir changed" in played.verdict  # the controller took a block for the init


def _taken(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket()
    sock.bind(address)
    sock.listen()
    return sock


def test_a_taken_port_watches_the_checkouts_data_dir(tmp_path: Path) -> None:
    """Someone's server holds the ports: nothing is started or asked there; the checkout's
    ./pidctl-data is compared byte for byte."""
    addresses = _addresses()
    data = tmp_path / "pidctl-data"
    data.mkdir()
    (data / "00000000000000000000.log").write_bytes(b"history")
    with _taken(addresses[0]), _taken(addresses[1]):
        untouched = _check(tmp_path, addresses, play=False)
        untouched.start()
        assert untouched.proc is None
        untouched.finish()
        assert not untouched.failed and untouched.verdict.startswith("untouched"), untouched.verdict
        touched = _check(tmp_path, addresses, play=True)
        touched.start()
        assert touched.proc is None  # a taken port: never started, also when asked to
        (data / "00000000000000000000.log").write_bytes(b"history, and more")
        touched.finish()
    assert touched.failed
    assert "data dir changed: 00000000000000000000.log" in touched.verdict


def test_free_ports_and_no_playing_bind_nothing(tmp_path: Path) -> None:
    addresses = _addresses()
    check = _check(tmp_path, addresses, play=False)
    check.start()
    assert check.proc is None and check.directory is None
    check.finish()
    assert not check.failed and check.verdict.startswith("NOT CHECKED: nothing listens")
    assert port_free(addresses[0]) and port_free(addresses[1])


PLAYER = """
import sys, time
from pathlib import Path
from ops.testing.user_server import UserServerCheck
check = UserServerCheck(
    play_user=True,
    listen=("127.0.0.1", int(sys.argv[1])),
    metrics=("127.0.0.1", int(sys.argv[2])),
    checkout=Path(sys.argv[3]),
)
check.start()
print(check.proc.pid, check.directory, flush=True)
time.sleep(600)
"""


def test_a_killed_run_leaves_no_server_behind(tmp_path: Path) -> None:
    """The run's process is SIGKILLed before its end (it cannot stop the server itself):
    the played server gets SIGTERM from the kernel and frees the user's ports."""
    addresses = _addresses()
    ports = [str(addresses[0][1]), str(addresses[1][1])]
    player = subprocess.Popen(
        [sys.executable, "-c", PLAYER, *ports, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert player.stdout is not None
    pid, directory = player.stdout.readline().split()
    try:
        os.kill(player.pid, signal.SIGKILL)
        player.wait(30)
        wait_until(lambda: not _alive(int(pid)), "the played server gone with its run")
        assert port_free(addresses[0]) and port_free(addresses[1])
    finally:
        if _alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) is gone for this purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
