"""Exceptions shared by the managers, and the base of every error ``pidctl`` reports."""

from __future__ import annotations

from typing import ClassVar


class PidctlError(Exception):
    """An error the operator can act on (a refusal, a bad setting, a failing disk), never a
    bug: the ``pidctl`` command prints it as ``pidctl: <line>`` on stderr and exits with
    :attr:`exit_code`. Each subclass says its own status and, if the message alone leaves
    it unsaid, what the line starts with; the command line copies nothing per error."""

    # (Class variables, said so: compiled rule 2.)
    #: The command's exit status when this error ends it (1: refused or failed).
    exit_code: ClassVar[int] = 1
    #: Put before each line of the message (what the error is about, if it does not say).
    line_prefix: ClassVar[str] = ""

    def cli_lines(self) -> list[str]:
        """What ``pidctl`` prints, each after ``pidctl: `` (one line but for a list of
        problems, as :class:`~pidctl.controller.settings.SettingsError` holds)."""
        return [self.line_prefix + line for line in str(self).splitlines() or [""]]


class UsageError(PidctlError):
    """A command's arguments do not make sense together or with what they name (exit 2, as
    argparse's own usage errors)."""

    exit_code = 2


class InvariantViolation(Exception):
    """A record contradicts the state it is replayed onto: the log is corrupt."""
