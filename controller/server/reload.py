"""SIGHUP: what a reload may change, how its files are read, and what it refuses.

A reload takes new ACLs, super users, the authorizer's switch and the SASL credentials
(``RELOADABLE_SETTINGS``: the configuration reference's ``reload`` column); every other
setting takes a restart, and a reload that finds one changed says which. Its files are read
in a worker thread, under a time limit: a file on a hung mount blocks its reader, never the
event loop. And since a reload cannot tell an operator's intent from an editor's write
caught half done, it never makes a change that a cut file could have made up
(:func:`reload_refusal`, and the config file's own check in ``settings.py``: a file ending
inside an ``[[acls]]`` table is refused); those take a restart. Writing the new file
elsewhere and renaming it into place (what a Kubernetes ConfigMap volume does) is never
caught half done: each reload opens the file anew.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from pidctl.controller.core.acl import Authorizer
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.settings import RELOADABLE_SETTINGS, Settings


@dataclass(frozen=True, slots=True)
class Reloaded:
    """What a reload read: the settings, and the authorizer and credentials they make."""

    settings: Settings
    authorizer: Authorizer
    credentials: CredentialStore


def build_authorizer(settings: Settings) -> Authorizer:
    # Separated by ";" as Kafka's super.users: a certificate's principal contains commas.
    super_users = [u.strip() for u in settings.super_users.split(";") if u.strip()]
    return Authorizer(settings.acls, super_users, enabled=settings.authorizer == "acl")


def load_credentials(settings: Settings) -> CredentialStore:
    if not settings.credentials_file:
        return CredentialStore()
    return CredentialStore.load(Path(settings.credentials_file))


def read_reload(load: Callable[[], Settings]) -> Reloaded:
    """The configuration ``load`` reads, and the authorizer and credentials it makes
    (blocking: in a worker thread)."""
    settings = load()
    return Reloaded(settings, build_authorizer(settings), load_credentials(settings))


class ReloadTimedOut(Exception):
    """The reload's files were not read within the time allowed (a hung mount?)."""


class StillReading(Exception):
    """A reload's files are still being read (its thread is stuck): another would be too."""


class ReloadReader:
    """Reads a reload's files in a worker thread, one reload at a time, waiting at most
    ``timeout_s``; a read that takes longer is left to finish in its thread (a thread
    blocked in ``open`` cannot be stopped), and the next reload is refused until it has."""

    def __init__(self, nursery: trio.Nursery, timeout_s: float) -> None:
        self._nursery = nursery
        self.timeout_s = timeout_s
        self._reading: trio.Event | None = None

    async def read(self, load: Callable[[], Settings]) -> Reloaded:
        """:func:`read_reload` off the event loop; raises what it raised,
        :class:`ReloadTimedOut` or :class:`StillReading`."""
        if self._reading is not None and not self._reading.is_set():
            raise StillReading(
                "the previous reload is still reading its files (a hung mount?); a new one "
                "is taken once it has returned"
            )
        done = self._reading = trio.Event()
        outcome: list[Reloaded | Exception] = []

        async def read_in_thread() -> None:
            try:
                # Abandoned at shutdown: a thread blocked on a hung mount never returns.
                outcome.append(
                    await trio.to_thread.run_sync(read_reload, load, abandon_on_cancel=True)
                )
            except Exception as e:  # (for the reload to report)
                outcome.append(e)
            finally:
                done.set()

        self._nursery.start_soon(read_in_thread)
        with trio.move_on_after(self.timeout_s):
            await done.wait()
        if not outcome:
            raise ReloadTimedOut(
                f"the configuration and credentials files were not read within "
                f"{self.timeout_s * 1000:.0f} ms (reload_timeout_ms): a hung mount?"
            )
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return result


def restart_only_changes(running: Settings, loaded: Settings) -> list[str]:
    """The settings that differ between ``running`` and ``loaded`` but a reload does not
    apply (they take a restart)."""
    return [
        f.name
        for f in dataclasses.fields(Settings)
        if f.name not in RELOADABLE_SETTINGS and getattr(running, f.name) != getattr(loaded, f.name)
    ]


def reload_refusal(
    authorizer: Authorizer,
    credentials: CredentialStore,
    new_authorizer: Authorizer,
    new_credentials: CredentialStore,
) -> str | None:
    """Why a reload from (``authorizer``, ``credentials``) to the new ones must be refused,
    or None. An empty config file, or one cut before its ``authorizer`` line, reads as
    ``authorizer = "none"``, and a missing or emptied credentials file as no users: a reload
    cannot tell them from an operator's intent, so it never makes a change that lets
    through what was refused — switching the authorizer off, removing a DENY ACL, removing
    every credential. (A file cut inside its ACLs is refused before: ``settings.py``.)"""
    if authorizer.enabled and not new_authorizer.enabled:
        return (
            'it would switch the authorizer off (authorizer = "none"): an empty or half-written '
            "config file reads so; restart the server to do that"
        )
    if credentials.users and not new_credentials.users:
        return (
            "it would remove every SASL credential: a missing or emptied credentials file reads "
            "so; restart the server to do that"
        )
    removed_denials = {a for a in authorizer.acls if a.permission == "deny"} - set(
        new_authorizer.acls
    )
    if authorizer.enabled and removed_denials:
        return f"it would remove {len(removed_denials)} DENY ACL(s); restart the server to do that"
    return None
