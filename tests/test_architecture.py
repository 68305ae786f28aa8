"""The rooms of the code and what each may import (ARCHITECTURE.md): checked on every run.

protocol ← core ← api, log ← server; the libraries (client, broker, spark) ← protocol, core.
Inside server: telemetry, security ← fleet, transport ← the wiring (``server/app.py``).
The command line, the settings and import-zk sit on top and may use every room. Read from
the source with ``ast``, so a forbidden import fails here before anyone runs it. And the one
rule of names: a shipped module is ``pidctl.`` and its path, a leading ``ops/`` dropped.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Source folder of each room, and its name once installed.
ROOMS = {
    "protocol": ("protocol", "pidctl.protocol"),
    "core": ("controller/core", "pidctl.controller.core"),
    "api": ("controller/api", "pidctl.controller.api"),
    "log": ("controller/log", "pidctl.controller.log"),
    "telemetry": ("controller/server/telemetry", "pidctl.controller.server.telemetry"),
    "security": ("controller/server/security", "pidctl.controller.server.security"),
    "fleet": ("controller/server/fleet", "pidctl.controller.server.fleet"),
    "transport": ("controller/server/transport", "pidctl.controller.server.transport"),
    "server": ("controller/server", "pidctl.controller.server"),
    "client": ("ops/client", "pidctl.client"),
    "broker": ("ops/broker", "pidctl.broker"),
    "spark": ("ops/spark", "pidctl.spark"),
}
#: What each room may import besides itself (and third-party packages).
ALLOWED = {
    "protocol": set(),
    "core": {"protocol"},
    "api": {"protocol", "core"},
    "log": {"protocol", "core"},
    # Metrics and logs, which every room of the server reports into.
    "telemetry": {"protocol", "core"},
    # SASL and client certificates: pure but for reading the credentials file.
    "security": {"protocol", "core"},
    # The shared counter in etcd and the task that leases from it.
    "fleet": {"protocol", "core", "api", "settings"},
    # Sockets: admission, a task per connection, the poller, outboxes, the HTTP endpoint.
    "transport": {"protocol", "core", "api", "settings", "security", "telemetry"},
    # The wiring (app.py): every room of the server, and the log.
    "server": {
        "protocol",
        "core",
        "api",
        "log",
        "settings",
        "telemetry",
        "security",
        "fleet",
        "transport",
    },
    "client": {"protocol"},
    "broker": {"protocol", "core", "client"},
    "spark": {"protocol", "core", "client", "broker"},
}
#: Imports that never run in a served process (no sockets, trio or clocks in protocol/).
FORBIDDEN_THIRD_PARTY = {"protocol": {"trio", "socket", "time", "ssl"}}


def _room_of(module: str) -> str | None:
    if module == "pidctl.controller.settings":
        return "settings"
    for room, (_, name) in ROOMS.items():  # a room inside another comes first
        if module == name or module.startswith(name + "."):
            return room
    if module.startswith("pidctl."):
        return "top"  # cli, zk_import: nothing below may import them
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import; use pidctl.*")
            found.append((node.lineno, node.module or ""))
    return found


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_imports_only_what_lies_below_it(room: str) -> None:
    folder, _ = ROOMS[room]
    inner = [ROOT / f for r, (f, _) in ROOMS.items() if f.startswith(folder + "/")]
    problems = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if any(path.is_relative_to(f) for f in inner):
            continue  # a room of its own, checked on its own
        for line, module in _imports(path):
            target = _room_of(module)
            top = module.split(".")[0]
            if top in FORBIDDEN_THIRD_PARTY.get(room, set()):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {room} imports {module}")
            if target is None or target == room:
                continue
            if target not in ALLOWED[room]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {room} imports {module}")
    assert problems == []


def test_nothing_imports_the_source_folders_by_their_own_names() -> None:
    """Only pidctl.* is installed; ``ops.testing`` and ``ops.bench`` run from a checkout."""
    problems = []
    for folder in ("protocol", "controller", "ops", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in _imports(path):
                top = module.split(".")[0]
                shipped = module.startswith(("ops.client", "ops.broker", "ops.spark"))
                if top in ("controller", "protocol") or shipped:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    assert problems == []


def test_the_wheel_leaves_out_the_test_harnesses() -> None:
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not any("testing" in p or "bench" in p for p in packages["packages"])
    mapped = set(packages["package-dir"].values())
    assert mapped == {"protocol", "controller", "ops/client", "ops/broker", "ops/spark"}
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copied = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert not any(c.startswith(("ops/testing", "ops/bench")) or c == "ops" for c in copied)


def test_each_room_of_the_server_holds_modules() -> None:
    """A room that moved or emptied fails here, not silently as a room with nothing to check."""
    for room in ("telemetry", "security", "fleet", "transport", "server"):
        folder, _ = ROOMS[room]
        assert [p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"], room


def test_the_settings_import_no_server_room() -> None:
    """Every room may read the settings (``controller/settings.py``); the settings read
    nothing of the server's rooms back (their defaults and parsers live in the rooms below,
    or in the settings themselves): no arrow points up."""
    path = ROOT / "controller/settings.py"
    up = [m for _, m in _imports(path) if m.startswith("pidctl.controller.server")]
    assert up == []


def test_the_quorum_controller_knows_no_handler() -> None:
    """``api/quorum.py`` (apply and snapshots) lies below the handlers and their responses
    (Kafka's QuorumController below its ControllerApis): it imports neither, so whatever
    writes records without a request (start-up, expiry, the lease keeper, import-zk) needs
    no handler."""
    path = ROOT / "controller/api/quorum.py"
    above = [m for _, m in _imports(path) if m.startswith("pidctl.controller.api.")]
    assert above == []


def import_name(folder: str) -> str:
    """ARCHITECTURE.md's one rule: a shipped folder's import name is ``pidctl.`` and its
    path, a leading ``ops/`` dropped (``ops/spark/examples`` is ``pidctl.spark.examples``,
    ``controller/api`` is ``pidctl.controller.api``)."""
    return "pidctl." + folder.removeprefix("ops/").replace("/", ".")


def package_folders(setup: dict[str, Any]) -> dict[str, str]:
    """Each package ``[tool.setuptools]`` ships, and the folder it is read from (setuptools'
    reading of ``package-dir``: the longest mapped prefix of the name, the rest folders)."""
    mapped: dict[str, str] = setup.get("package-dir", {})
    folders = {}
    for package in setup["packages"]:
        parts = package.split(".")
        folder = "/".join(parts)
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in mapped:
                folder = "/".join([mapped[prefix], *parts[cut:]])
                break
        folders[package] = folder
    return folders


def misnamed(setup: dict[str, Any]) -> dict[str, str]:
    """Packages whose folder's name by :func:`import_name` is another: package → that name."""
    named = {p: import_name(f) for p, f in package_folders(setup).items()}
    return {p: name for p, name in named.items() if name != p}


def _setup() -> dict[str, Any]:
    import tomllib

    setup: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    return setup


def test_every_shipped_package_is_named_by_the_rule() -> None:
    """pyproject's packages and their folders follow :func:`import_name`, so a newcomer (or a
    tool) finds a module from its name and names a module from its path."""
    setup = _setup()
    assert misnamed(setup) == {}
    folders = package_folders(setup)
    assert [p for p, f in folders.items() if not (ROOT / f / "__init__.py").is_file()] == []
    # Every folder of Python under a shipped root is a package shipped (so named by the rule).
    holding = {
        str(path.parent.relative_to(ROOT))
        for root in setup["package-dir"].values()
        for path in (ROOT / root).rglob("*.py")
    }
    assert holding - set(folders.values()) == set()


def test_the_rule_finds_a_package_named_otherwise() -> None:
    setup = _setup()
    moved = {**setup, "package-dir": {**setup["package-dir"], "pidctl.spark": "ops/sparkle"}}
    assert misnamed(moved) == {
        "pidctl.spark": "pidctl.sparkle",
        "pidctl.spark.examples": "pidctl.sparkle.examples",
    }
    harness = {"packages": ["pidctl.bench"], "package-dir": {"pidctl.bench": "ops/testing"}}
    assert misnamed(harness) == {"pidctl.bench": "pidctl.testing"}
