"""Muted connections: the mute ends when the client hangs up, even behind requests it sent
meanwhile (which a mute must not read), and not otherwise. Over real loopback TCP."""

from __future__ import annotations

import select
import time
from collections.abc import AsyncIterator

import pytest
import trio

from pidctl.controller.server.transport.hangups import Hangups
from tests.controller.server.conftest import ANSWER_BOUND_S, TcpPair

pytestmark = pytest.mark.skipif(
    not hasattr(select, "EPOLLRDHUP"), reason="the hang-up watch needs Linux's epoll"
)


@pytest.fixture
async def hangups() -> AsyncIterator[Hangups]:
    hangups = Hangups()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hangups.run)
        await trio.sleep(0)  # (running)
        yield hangups
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("sent_meanwhile", [b"", b"\0\0\0\x05hello"], ids=["idle", "requests"])
async def test_a_mute_ends_when_the_client_hangs_up(
    hangups: Hangups, tcp_pair: TcpPair, sent_meanwhile: bytes
) -> None:
    server, client = tcp_pair
    outcome: list[bool] = []

    async def muted() -> None:
        outcome.append(await hangups.mute(server.socket.fileno(), 100.0))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(muted)
        with trio.fail_after(ANSWER_BOUND_S):
            while len(hangups) == 0:
                await trio.sleep(0.001)
            if sent_meanwhile:  # unread behind the mute: the hang-up is seen all the same
                await client.send_all(sent_meanwhile)
                await trio.sleep(0.05)
                assert outcome == []
            await client.aclose()
    assert outcome == [True]
    assert time.monotonic() - started < ANSWER_BOUND_S
    assert len(hangups) == 0
    # Nothing was read: what the client sent is still there for whoever reads next.
    assert await server.receive_some(100) == sent_meanwhile


async def test_a_mute_runs_its_time_while_the_client_stays(
    hangups: Hangups, tcp_pair: TcpPair
) -> None:
    server, client = tcp_pair
    await client.send_all(b"\0\0\0\x01x")  # readable is not a hang-up
    started = trio.current_time()
    assert await hangups.mute(server.socket.fileno(), 0.2) is False
    assert trio.current_time() - started >= 0.2
    assert len(hangups) == 0


async def test_without_the_watch_a_mute_is_a_sleep(tcp_pair: TcpPair) -> None:
    server, client = tcp_pair
    await client.aclose()
    assert await Hangups().mute(server.socket.fileno(), 0.05) is False
