"""Settings from the environment: what Kubernetes' service links put there is not a setting."""

from __future__ import annotations

import pytest

from pidctl.controller.settings import (
    SettingsError,
    is_service_link_variable,
    load_settings_with_sources,
)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PIDCTL_SERVICE_HOST", "10.96.0.11"),
        ("PIDCTL_SERVICE_HOST", "fd00::1"),
        ("PIDCTL_SERVICE_PORT", "9093"),
        ("PIDCTL_SERVICE_PORT_METRICS", "9464"),
        ("PIDCTL_PORT", "tcp://10.96.0.11:9093"),
        ("PIDCTL_PORT_9093_TCP", "tcp://10.96.0.11:9093"),
        ("PIDCTL_PORT_9093_TCP_PROTO", "tcp"),
        ("PIDCTL_PORT_9093_TCP_PORT", "9093"),
        ("PIDCTL_PORT_9093_TCP_ADDR", "10.96.0.11"),
        ("PIDCTL_PORT_53_UDP", "udp://10.96.0.11:53"),
        ("PIDCTL_BROKER_PORT_9093_TCP_ADDR", "10.96.0.13"),  # a Service named pidctl-broker
    ],
)
def test_service_link_variables_are_recognised(name: str, value: str) -> None:
    assert is_service_link_variable(name, value)
    settings, sources = load_settings_with_sources({}, {name: value})
    assert sources == {} and settings.listen.port == 9093


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PIDCTL_PORT", "9093"),  # someone setting a port: not what Kubernetes writes
        ("PIDCTL_SERVICE_HOST", "pidctl.example"),
        ("PIDCTL_SERVICE_PORT", "http"),
        ("PIDCTL_PORT_9093_TCP_PROTO", "http"),
        ("PIDCTL_FOO", "1"),
        ("PIDCTL_PORTS", "tcp://1.2.3.4:5"),
    ],
)
def test_anything_else_is_still_an_unknown_setting(name: str, value: str) -> None:
    assert not is_service_link_variable(name, value)
    with pytest.raises(SettingsError, match=f"{name}: unknown setting"):
        load_settings_with_sources({}, {name: value})
