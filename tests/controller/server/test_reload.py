"""What a reload (SIGHUP) takes from the new settings is what the configuration reference
marks ``reload``: a setting read by the reload but documented as restart-only, or the other
way round, fails here. The reload itself, against a running server, is
tests/e2e/test_reload.py."""

from __future__ import annotations

from typing import Any

from pidctl.controller.server.app import build_authorizer, load_credentials
from pidctl.controller.settings import RELOADABLE_SETTINGS, Settings

_read: set[str] = set()


class _RecordingSettings(Settings):
    """Default settings that note every setting read from them."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            _read.add(name)
        return super().__getattribute__(name)


def test_a_reload_reads_exactly_the_reloadable_settings() -> None:
    # AppState.reload builds its new state with these two and nothing else from the settings.
    _read.clear()
    settings = _RecordingSettings()
    build_authorizer(settings)
    load_credentials(settings)
    assert _read == set(RELOADABLE_SETTINGS)
