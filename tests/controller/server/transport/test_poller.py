"""The poller: a parked connection's round runs when its socket is readable, the connection's
task wakes when a round says so (or raises, or the poller stops), and a cancelled wait
unparks. Over real loopback TCP."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from pidctl.controller.server.transport.poller import Poller, Round, available
from tests.controller.server.conftest import TcpPair

pytestmark = pytest.mark.skipif(not available(), reason="the poller needs Linux's epoll")


@pytest.fixture
async def poller() -> AsyncIterator[Poller]:
    poller = Poller()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        yield poller
        nursery.cancel_scope.cancel()


def _reader(fd: int, got: list[bytes], stop_at: bytes = b"") -> Round:
    """A round that reads what came and stays parked until it reads ``stop_at``."""

    def round() -> bool:
        data = os.read(fd, 1024)
        got.append(data)
        return data != stop_at

    return round


async def test_rounds_run_as_data_comes_until_one_hands_back(
    poller: Poller, tcp_pair: TcpPair
) -> None:
    server, client = tcp_pair
    got: list[bytes] = []
    woken = trio.Event()

    async def parked() -> None:
        await poller.park(server.socket.fileno(), _reader(server.socket.fileno(), got, b"end"))
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked)
        await trio.testing.wait_all_tasks_blocked()
        assert len(poller) == 1 and got == []  # nothing sent: no round
        for request in (b"one", b"two"):
            await client.send_all(request)
            with trio.fail_after(5):
                while got[-1:] != [request]:
                    await trio.sleep(0.001)
        assert not woken.is_set()  # every round so far stayed parked
        await client.send_all(b"end")
        with trio.fail_after(5):
            await woken.wait()
    assert got == [b"one", b"two", b"end"]
    assert len(poller) == 0


@pytest.mark.parametrize("events_per_pass", [1, 7, 256])
async def test_every_ready_connection_is_served(events_per_pass: int) -> None:
    """Also when more are ready than one pass takes: the next passes take the rest."""
    poller = Poller(events_per_pass)
    pairs = [socket.socketpair() for _ in range(20)]
    calls: list[int] = []

    def counting(index: int, fd: int) -> Round:
        def round() -> bool:
            os.read(fd, 1024)
            calls.append(index)
            return True

        return round

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        for index, (ours, _) in enumerate(pairs):
            nursery.start_soon(poller.park, ours.fileno(), counting(index, ours.fileno()))
        await trio.testing.wait_all_tasks_blocked()
        for _, theirs in pairs:
            theirs.send(b"x")  # all readable at once
        with trio.fail_after(5):
            while len(calls) < len(pairs):
                await trio.sleep(0.001)
        assert sorted(calls) == list(range(len(pairs)))
        nursery.cancel_scope.cancel()
    for ours, theirs in pairs:
        ours.close()
        theirs.close()


async def test_a_cancelled_wait_unparks(poller: Poller, tcp_pair: TcpPair) -> None:
    server, client = tcp_pair
    got: list[bytes] = []
    with trio.move_on_after(0.05):
        await poller.park(server.socket.fileno(), _reader(server.socket.fileno(), got))
    assert len(poller) == 0
    await client.send_all(b"after")
    await trio.testing.wait_all_tasks_blocked()
    assert got == []  # no round for a connection that left
    # and it may park again
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            poller.park, server.socket.fileno(), _reader(server.socket.fileno(), got)
        )
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert got == [b"after"]


async def test_a_round_that_raises_raises_in_its_task_and_others_go_on(
    poller: Poller, tcp_pair: TcpPair
) -> None:
    server, client = tcp_pair
    other_ours, other_theirs = socket.socketpair()

    def failing() -> bool:
        raise RuntimeError("a bug in a round")

    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.park, other_ours.fileno(), _reader(other_ours.fileno(), got))
        await client.send_all(b"x")
        with pytest.raises(RuntimeError, match="a bug in a round"), trio.fail_after(5):
            await poller.park(server.socket.fileno(), failing)
        other_theirs.send(b"still served")
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert got == [b"still served"]
    other_ours.close()
    other_theirs.close()


async def test_a_pass_without_waiting_serves_what_is_readable_now() -> None:
    """``serve_ready``, as the log's writer calls it before a commit: the rounds of the
    connections readable at that moment, none of the others, and no wait; nothing once the
    poller has stopped."""
    poller = Poller()
    pairs = [socket.socketpair() for _ in range(3)]
    got: list[list[bytes]] = [[] for _ in pairs]
    running = trio.CancelScope()

    async def run() -> None:
        with running:
            await poller.run()

    async with trio.open_nursery() as nursery:
        for index, (ours, _) in enumerate(pairs):
            round = _reader(ours.fileno(), got[index], b"end")
            nursery.start_soon(poller.park, ours.fileno(), round)
        await trio.testing.wait_all_tasks_blocked()  # parked, and the poller not running
        assert poller.serve_ready() == 0
        pairs[0][1].send(b"one")
        pairs[2][1].send(b"end")
        assert poller.serve_ready() == 2
        assert got == [[b"one"], [], [b"end"]]
        assert len(poller) == 2  # the round that read "end" woke its task
        assert poller.serve_ready() == 0  # read already: not served twice
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        running.cancel()
    assert poller.closed
    pairs[1][1].send(b"late")
    assert poller.serve_ready() == 0 and got[1] == []
    for ours, theirs in pairs:
        ours.close()
        theirs.close()


async def test_a_poller_that_stops_wakes_everyone_parked(tcp_pair: TcpPair) -> None:
    server, _ = tcp_pair
    poller = Poller()
    running = trio.CancelScope()
    woken = trio.Event()

    async def run() -> None:
        with running:
            await poller.run()

    async def parked() -> None:
        await poller.park(server.socket.fileno(), lambda: True)
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        nursery.start_soon(parked)
        await trio.testing.wait_all_tasks_blocked()
        assert len(poller) == 1 and not woken.is_set()
        running.cancel()
        with trio.fail_after(5):
            await woken.wait()
    assert poller.closed and len(poller) == 0
    with trio.fail_after(5):  # parking after the end returns at once
        await poller.park(server.socket.fileno(), lambda: True)
