"""Settings: what Kubernetes' service links put in the environment is not a setting, and
`config show` prints a configuration that loads back as the same settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trustme

from pidctl.controller.settings import (
    Settings,
    SettingsError,
    is_service_link_variable,
    load_settings_with_sources,
    show_settings,
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


def test_config_show_loads_back_as_the_same_settings(tmp_path: Path) -> None:
    """Every kind of value (addresses, paths, numbers, text with quotes and non-ASCII, the
    arrays of tables), unset settings as comments, and a secret, which is never shown: fed
    back, it is unset and everything else is the same."""
    ca = trustme.CA()
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    config = tmp_path / "pidctl.toml"
    config.write_text(
        f"""
listeners = "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"
advertised_listener = "pidctl.example:9093"
ssl_certfile = "{cert_file}"
ssl_keyfile = "{key_file}"
ssl_keyfile_password = "s3cret"
ssl_cafile = "{ca_file}"
ssl_client_auth = "required"
super_users = 'User:CN=a "quoted",O=b;User:zoë'
authorizer = "acl"
pid_lease_prefetch_ratio = 0.25
init_producer_id_quota = 12.5
node_id = -3

[[acls]]
principal = "User:app"
operation = "Write"
resource_type = "TransactionalId"
resource_name = "app-"
pattern_type = "prefixed"

[[quota_overrides]]
client_id = "batch"
allocate_producer_ids_quota = 2
init_producer_id_quota = 4.5
"""
    )
    settings, sources = load_settings_with_sources({"node_id": "7"}, {}, config)
    shown = "\n".join(show_settings(settings, sources))
    assert "s3cret" not in shown
    assert "# ssl_keyfile_password = (set, not shown)" in shown
    assert "node_id = 7  # --node-id" in shown
    again = tmp_path / "shown.toml"
    again.write_text(shown)
    reloaded, _ = load_settings_with_sources({}, {}, again, for_reload=True)  # (an array)
    assert reloaded == dataclasses.replace(settings, ssl_keyfile_password="")


def test_config_show_of_the_defaults_loads_back() -> None:
    settings, sources = load_settings_with_sources({}, {})
    lines = show_settings(settings, sources)
    assert "# listeners = (unset)  # default" in lines
    assert 'log_format = "auto"  # default' in lines
    assert settings == Settings()


@pytest.mark.parametrize("value", ["0", "65536", "1048576", "67108864"])
def test_log_preallocate_bytes_takes_zero_or_whole_chunks_up_to_64_mib(value: str) -> None:
    settings, _ = load_settings_with_sources({}, {"PIDCTL_LOG_PREALLOCATE_BYTES": value})
    assert settings.log_preallocate_bytes == int(value)


@pytest.mark.parametrize("value", ["1", "65535", "67108865", "-1"])
def test_log_preallocate_bytes_refuses_what_would_preallocate_nothing_or_too_much(
    value: str,
) -> None:
    """Below one 64 KiB chunk, preallocation would silently do nothing; above 64 MiB, one
    write of zeros would hold the disk too long."""
    with pytest.raises(SettingsError, match="log_preallocate_bytes"):
        load_settings_with_sources({}, {"PIDCTL_LOG_PREALLOCATE_BYTES": value})


@pytest.mark.parametrize(
    ("text", "inside"),
    [
        ('authorizer = "acl"\n', False),
        ('[[acls]]\nprincipal = "User:a"\noperation = "Write"\n', True),
        ('[[acls]]\nprincipal = "User:a"\n# a comment, then nothing', True),
        ('acls = [\n  { principal = "User:a", operation = "Write" },\n]\n', False),
        ('[[acls]]\nprincipal = "User:a"\n[[quota_overrides]]\nclient_id = "x"\n', False),
    ],
    ids=["no-acls", "table-last", "comment-last", "array", "another-table-last"],
)
def test_a_file_ending_inside_an_acl_table_is_told(text: str, inside: bool) -> None:
    from pidctl.controller.settings import ends_inside_acl_table

    assert ends_inside_acl_table(text) is inside


def test_a_reload_refuses_a_file_ending_inside_an_acl_table(tmp_path: Path) -> None:
    from pidctl.controller.settings import ReloadRefused

    config = tmp_path / "pidctl.toml"
    config.write_text(
        'authorizer = "acl"\n[[acls]]\nprincipal = "User:a"\noperation = "IdempotentWrite"\n'
        'resource_type = "Cluster"\n'
    )
    load_settings_with_sources({}, {}, config)  # at start-up: taken
    with pytest.raises(ReloadRefused, match=r"ends inside an \[\[acls\]\] table"):
        load_settings_with_sources({}, {}, config, for_reload=True)
