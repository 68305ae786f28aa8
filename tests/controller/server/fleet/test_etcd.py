"""The shared counter against a real etcd (Debian's etcd-server) over its JSON gateway."""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

import pytest
import trio

from ops.testing.coordination import EtcdProcess, free_port
from pidctl.controller.server.fleet.etcd import (
    Counter,
    EtcdCounter,
    EtcdRefused,
    EtcdUnavailable,
)
from pidctl.protocol.addresses import EtcdLocation, HostPort


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("etcd://127.0.0.1:2379/pidctl", EtcdLocation((HostPort("127.0.0.1", 2379),), "pidctl")),
        (
            "etcds://a:1, b:2/x/y/",
            EtcdLocation((HostPort("a", 1), HostPort("b", 2)), "x/y", tls=True),
        ),
    ],
)
def test_locations(text: str, expected: EtcdLocation) -> None:
    assert EtcdLocation.parse(text) == expected
    assert EtcdLocation.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "text", ["http://a:1/p", "etcd://a:1", "etcd://a:1/", "etcd:///p", "etcd://a/p", "a:1/p"]
)
def test_bad_locations(text: str) -> None:
    with pytest.raises(ValueError):
        EtcdLocation.parse(text)


def _counter(etcd: EtcdProcess, **kwargs: object) -> EtcdCounter:
    return EtcdCounter(EtcdLocation.parse(etcd.pid_source("t")), **kwargs)  # type: ignore[arg-type]


async def test_compare_and_swap_takes_disjoint_ranges(etcd: EtcdProcess) -> None:
    one, two = _counter(etcd), _counter(etcd)
    seen = await one.read()
    assert seen == Counter(0, 0)  # no key yet
    first = await one.compare_and_swap(seen, 1000)
    assert first.succeeded and first.counter.value == 1000
    # The other controller read before, so its swap fails and tells it the new value.
    lost = await two.compare_and_swap(seen, 1000)
    assert not lost.succeeded and lost.counter == first.counter
    won = await two.compare_and_swap(lost.counter, 2000)
    assert won.succeeded and won.revision > first.revision
    assert etcd.counter("t") == 2000
    await one.aclose()
    await two.aclose()


async def test_each_member_records_its_leases_beside_the_counter(etcd: EtcdProcess) -> None:
    """A leasing controller's swap records its lease's end under leases/<node id> in the same
    transaction; every read and failed swap returns the highest recorded with the counter,
    so a counter set back (or deleted) shows below it, whoever took the lease."""
    location = EtcdLocation.parse(etcd.pid_source("recorded"))
    one, two = EtcdCounter(location, member="1"), EtcdCounter(location, member="2")
    importer = EtcdCounter(location)  # pidctl import-zk: records nothing
    first = await one.compare_and_swap(await one.read(), 3000)
    assert first.counter == Counter(3000, first.revision, leased=3000)
    second = await two.compare_and_swap(await two.read(), 9000)
    assert second.succeeded and second.counter.leased == 9000
    raised = await importer.compare_and_swap(await importer.read(), 12_000)
    assert raised.succeeded and raised.counter.leased == 9000
    assert (await one.read()).leased == 9000 and (await one.read()).value == 12_000
    etcd.set_counter(6000, "recorded")  # set back by hand: above one's lease, below two's
    seen = await one.read()
    assert (seen.value, seen.leased) == (6000, 9000)
    stale = await one.compare_and_swap(first.counter, 4000)  # a failed swap tells the same
    assert not stale.succeeded and (stale.counter.value, stale.counter.leased) == (6000, 9000)
    etcd.delete_counter("recorded")
    assert (await two.read()) == Counter(0, 0, leased=9000)
    for counter in (one, two, importer):
        await counter.aclose()


async def test_concurrent_swappers_never_take_the_same_range(etcd: EtcdProcess) -> None:
    taken: list[tuple[int, int]] = []

    async def taker() -> None:
        counter = _counter(etcd)
        seen = await counter.read()
        for _ in range(15):
            while True:
                swap = await counter.compare_and_swap(seen, seen.value + 100)
                if swap.succeeded:
                    taken.append((seen.value, seen.value + 100))
                    seen = swap.counter
                    break
                seen = swap.counter
        await counter.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(taker)
    assert sorted(taken) == [(i * 100, i * 100 + 100) for i in range(60)]


async def test_a_dead_endpoint_is_skipped_and_all_dead_is_unavailable(etcd: EtcdProcess) -> None:
    dead = free_port()
    seen: list[tuple[str, bool]] = []
    location = EtcdLocation.parse(f"etcd://127.0.0.1:{dead},{etcd.endpoint}/t")
    counter = EtcdCounter(location, on_request=lambda op, s, failed: seen.append((op, failed)))
    assert (await counter.read()).value == 0
    assert seen == [("range", True), ("range", False)]
    etcd.kill()
    with pytest.raises(EtcdUnavailable, match=str(dead)):
        await counter.read()
    await counter.aclose()


def _post(etcd: EtcdProcess, path: str, body: dict[str, str]) -> None:
    request = urllib.request.Request(
        f"http://{etcd.endpoint}{path}", data=json.dumps(body).encode()
    )
    urllib.request.urlopen(request, timeout=5).close()


async def test_password_authentication(etcd: EtcdProcess) -> None:
    _post(etcd, "/v3/auth/role/add", {"name": "root"})
    _post(etcd, "/v3/auth/user/add", {"name": "root", "password": "s3cret"})
    _post(etcd, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    _post(etcd, "/v3/auth/enable", {})
    with pytest.raises(EtcdRefused, match="user name is empty"):
        await _counter(etcd).read()
    with pytest.raises(EtcdRefused, match="authentication failed"):
        await _counter(etcd, username="root", password="wrong").read()
    counter = _counter(etcd, username="root", password="s3cret")
    swap = await counter.compare_and_swap(await counter.read(), 5000)
    assert swap.succeeded
    # etcd restarted: its simple tokens are gone; the client authenticates again by itself.
    etcd.kill()
    etcd.start()
    assert (await counter.read()).value == 5000
    await counter.aclose()


async def test_tls(tls_etcd: tuple[EtcdProcess, Path]) -> None:
    etcd, ca_file = tls_etcd
    location = EtcdLocation.parse(etcd.pid_source("t"))
    assert location.tls
    untrusting = EtcdCounter(location)
    with pytest.raises(EtcdUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        await untrusting.read()
    await untrusting.aclose()
    counter = EtcdCounter(location, ssl_context=ssl.create_default_context(cafile=ca_file))
    assert (await counter.compare_and_swap(Counter(0, 0), 77)).succeeded
    await counter.aclose()
