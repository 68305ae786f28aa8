"""What a SIGHUP reads, how long it may take, and what it refuses; what it takes from the
new settings is what the configuration reference marks ``reload`` (a setting read by the
reload but documented as restart-only, or the other way round, fails here). The server's
side is tests/e2e/test_reload.py, with real files and signals."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import trio

from pidctl.controller.core.acl import Acl, Authorizer
from pidctl.controller.server.reload import (
    ReloadReader,
    ReloadTimedOut,
    StillReading,
    build_authorizer,
    load_credentials,
    reload_refusal,
    restart_only_changes,
)
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.settings import RELOADABLE_SETTINGS, Settings
from pidctl.protocol.addresses import HostPort


async def test_a_read_that_hangs_times_out_and_holds_back_the_next_one() -> None:
    released = threading.Event()

    def hung() -> Settings:
        released.wait(30)  # (a thread blocked in open(2) on a hung mount)
        return Settings()

    async with trio.open_nursery() as nursery:
        reader = ReloadReader(nursery, timeout_s=0.1)
        with pytest.raises(ReloadTimedOut, match="reload_timeout_ms"):
            await reader.read(hung)
        with pytest.raises(StillReading):
            await reader.read(Settings)
        released.set()
        with trio.fail_after(30):
            while True:  # taken again once the hung read has returned
                try:
                    loaded = await reader.read(Settings)
                    break
                except StillReading:
                    await trio.sleep(0.01)
        assert loaded.settings == Settings()
        assert not loaded.authorizer.enabled


async def test_a_read_that_fails_raises_its_error() -> None:
    def broken() -> Settings:
        raise ValueError("config file x: bad")

    async with trio.open_nursery() as nursery:
        reader = ReloadReader(nursery, timeout_s=10)
        with pytest.raises(ValueError, match="bad"):
            await reader.read(broken)
        assert (await reader.read(Settings)).settings == Settings()  # not held back


def test_the_settings_that_take_a_restart_are_named() -> None:
    running = Settings()
    loaded = dataclasses.replace(
        running,
        listen=HostPort("0.0.0.0", 9093),
        max_connections=5,
        super_users="User:ops",
        authorizer="acl",
    )
    assert restart_only_changes(running, loaded) == ["listen", "max_connections"]
    assert restart_only_changes(running, running) == []


ALLOW = Acl("User:a", "Write", "TransactionalId", "*")
DENY = Acl("User:a", "Write", "TransactionalId", "payments", permission="deny")


@pytest.mark.parametrize(
    ("before", "after", "refused"),
    [
        (Authorizer([ALLOW], enabled=True), Authorizer([]), "authorizer off"),
        (Authorizer([ALLOW, DENY], enabled=True), Authorizer([ALLOW], enabled=True), "DENY"),
        # An ALLOW less only refuses more; switching the authorizer on too.
        (Authorizer([ALLOW, DENY], enabled=True), Authorizer([DENY], enabled=True), None),
        (Authorizer([]), Authorizer([ALLOW], enabled=True), None),
    ],
)
def test_a_reload_never_lets_through_what_was_refused(
    before: Authorizer, after: Authorizer, refused: str | None
) -> None:
    users = CredentialStore()
    reason = reload_refusal(before, users, after, users)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused.split()[0] in reason


_read: set[str] = set()


class _RecordingSettings(Settings):
    """Default settings that note every setting read from them."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            _read.add(name)
        return super().__getattribute__(name)


def test_a_reload_reads_exactly_the_reloadable_settings() -> None:
    # A reload builds its new state with these two and nothing else from the settings.
    _read.clear()
    settings = _RecordingSettings()
    build_authorizer(settings)
    load_credentials(settings)
    assert _read == set(RELOADABLE_SETTINGS)
