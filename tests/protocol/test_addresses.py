from __future__ import annotations

import pytest

from pidctl.protocol.addresses import HostPort, parse_listener, parse_listeners


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("localhost:9093", "localhost", 9093), ("[::1]:0", "::1", 0), (" h:65535 ", "h", 65535)],
)
def test_host_port(text: str, host: str, port: int) -> None:
    assert HostPort.parse(text) == HostPort(host, port)


@pytest.mark.parametrize("text", ["localhost", ":9093", "h:", "h:x", "h:65536", "h:-1"])
def test_bad_host_port_names_the_input(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        HostPort.parse(text)


def test_ipv6_is_printed_in_brackets() -> None:
    assert str(HostPort("::1", 9)) == "[::1]:9"
    assert str(HostPort("h", 9)) == "h:9"


def test_listeners() -> None:
    assert parse_listener("SASL_SSL://h:9094") == ("SASL_SSL", HostPort("h", 9094))
    assert parse_listeners("A://a:1, B://[::1]:2") == [
        ("A", HostPort("a", 1)),
        ("B", HostPort("::1", 2)),
    ]
    for bad in ("h:1", "://h:1", "A://h"):
        with pytest.raises(ValueError, match="NAME://HOST:PORT"):
            parse_listener(bad)
    with pytest.raises(ValueError, match="no listener"):
        parse_listeners(" , ")
