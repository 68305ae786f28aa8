"""The ``pidctl`` command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pidctl.controller.core.errors import PidctlError, UsageError

EXAMPLES = """\
examples:
  pidctl format --data-dir ./pidctl-data         # once: a new data dir (a new cluster)
  pidctl serve                                   # 127.0.0.1:9093, data in ./pidctl-data
  pidctl serve --listen 0.0.0.0:9093 --advertised-listener pidctl.internal:9093
  pidctl status --bootstrap 127.0.0.1:9093
  pidctl config show --config pidctl.toml
  pidctl register --bootstrap 127.0.0.1:9093 --broker-id 1 --listener PLAINTEXT://kafka-1:9092
  pidctl allocate --bootstrap 127.0.0.1:9093 --broker-id 1 --broker-epoch 2  # as registered
  pidctl log dump --data-dir ./pidctl-data --json
  pidctl log dump --data-dir ./pidctl-data --broker 1 --since 2026-11-01T00:00:00Z --summary
  pidctl log verify --data-dir ./pidctl-data
  pidctl log reserve --data-dir ./pidctl-data --producer-id 5000000   # controller stopped
  pidctl import-zk --zookeeper zk-1:2181 --data-dir ./pidctl-data   # controller stopped
  pidctl import-zk --zookeeper zk-1:2181 --pid-source etcd://etcd-1:2379/pidctl
  pidctl sink recover sqlite:///data/orders.db orders --older-than 0   # no write running
  pidctl sink versions postgresql://etl@db/warehouse orders
  pidctl kafka verify --bootstrap-servers kafka-1:9092 --topic orders --app-id nightly --version 7
  echo "$PASSWORD" | pidctl users add --credentials-file users.json --user broker-1 --password-stdin
"""


def _settings_help() -> str:
    from pidctl.controller.settings import describe_settings

    rows = [
        f"  {s.name:<30} {s.default or '-':<24} {s.unit:<8} {s.doc}"
        + (" [reloaded by SIGHUP]" if s.reloadable else "")
        for s in describe_settings()
    ]
    return (
        "settings (flag --NAME, environment PIDCTL_NAME, or NAME in the --config TOML file;\n"
        "precedence flag > env > file > default; a change takes a restart unless marked\n"
        "[reloaded by SIGHUP]):\n" + "\n".join(rows)
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pidctl",
        description="A standalone Kafka producer-ID controller (KIP-730).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=version_line(), help="the version and build"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the controller",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_setting_flags(serve)
    serve.add_argument(
        "--format-if-missing",
        action="store_true",
        help="format the data dir first if it does not exist (what `ops/dev.sh serve` does "
        "for ./pidctl-data); a start that then fails removes it again",
    )
    format_cmd = commands.add_parser(
        "format",
        help="create a data dir: a new, empty metadata log for a new cluster (serve starts "
        "only on a formatted data dir)",
        description="Create the data dir (settings as for serve: --data-dir, --cluster-id, "
        "--node-id, --config, PIDCTL_*) with a new metadata log. Refuses a formatted one.",
    )
    _add_setting_flags(format_cmd)
    format_cmd.add_argument(
        "--ignore-formatted",
        action="store_true",
        help="exit 0, changing nothing, when the data dir is already formatted",
    )
    format_cmd.add_argument(
        "--parents",
        action="store_true",
        help="create the data dir's missing parent directories too (without it, a data dir "
        "whose parent does not exist is refused: a typo or a volume not mounted)",
    )
    import_zk = commands.add_parser(
        "import-zk",
        help="raise the high-water mark above ZooKeeper's /latest_producer_id_block (KIP-730 "
        "upgrade): in the data dir (controller stopped) or, with --pid-source, in etcd",
    )
    import_zk.add_argument("--zookeeper", required=True, metavar="HOST:PORT[,HOST:PORT]")
    import_zk.add_argument("--znode", default="/latest_producer_id_block")
    import_zk.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for ZooKeeper (default 10)",
    )
    _add_setting_flags(import_zk)
    config_cmd = commands.add_parser("config", help="inspect settings")
    config_commands = config_cmd.add_subparsers(
        dest="config_command", required=True, metavar="COMMAND"
    )
    show = config_commands.add_parser(
        "show", help="print the effective settings (flags, environment, file, defaults)"
    )
    _add_setting_flags(show)

    log_cmd = commands.add_parser("log", help="inspect a data dir (read-only)")
    log_commands = log_cmd.add_subparsers(dest="log_command", required=True, metavar="COMMAND")
    dump = log_commands.add_parser("dump", help="print every record with its offset and time")
    dump.add_argument("--data-dir", type=Path, required=True)
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.add_argument("--broker", type=int, metavar="ID", help="only records about this broker")
    dump.add_argument("--since", metavar="TIME", help="ISO 8601 time or epoch ms (inclusive)")
    dump.add_argument("--until", metavar="TIME", help="ISO 8601 time or epoch ms (inclusive)")
    dump.add_argument(
        "--summary",
        action="store_true",
        help="blocks and producer ids per holder, holes, restarts (instead of the records)",
    )
    verify = log_commands.add_parser("verify", help="check checksums and invariants")
    verify.add_argument("--data-dir", type=Path, required=True)
    reserve = log_commands.add_parser(
        "reserve",
        help="replace a missing or damaged reservation file (controller stopped): you know "
        "no producer id at or above --producer-id was handed out",
    )
    reserve.add_argument("--data-dir", type=Path, required=True)
    reserve.add_argument("--producer-id", type=int, required=True, metavar="N")
    reserve.add_argument(
        "--last-producer-id",
        type=int,
        metavar="N",
        help="the controller's last_producer_id, if set (default: PIDCTL_LAST_PRODUCER_ID, "
        "else 2^63-2): --producer-id may be at most the start of its last block",
    )
    reserve.add_argument(
        "--force",
        action="store_true",
        help="lower an intact reservation (refused without it: the reservation is what a "
        "start-up skips to, above grants the log's lost tail may have held)",
    )

    register = commands.add_parser("register", help="register a broker; prints its epoch")
    register.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    register.add_argument("--broker-id", type=int, required=True)
    register.add_argument("--cluster-id", help="default: the server's, from Metadata")
    register.add_argument(
        "--incarnation-id", type=uuid.UUID, help="default: a new random incarnation"
    )
    register.add_argument(
        "--listener",
        action="append",
        default=[],
        metavar="NAME://HOST:PORT",
        help="an advertised listener of the broker (repeatable)",
    )
    register.add_argument("--rack")

    users = commands.add_parser("users", help="SASL users in a credentials file (salted, hashed)")
    user_commands = users.add_subparsers(dest="users_command", required=True, metavar="COMMAND")
    add = user_commands.add_parser("add", help="add a user or change its password")
    add.add_argument("--credentials-file", type=Path, required=True)
    add.add_argument("--user", required=True)
    add.add_argument(
        "--mechanism",
        action="append",
        choices=["SCRAM-SHA-256", "SCRAM-SHA-512"],
        help="default: both (PLAIN checks passwords against these too)",
    )
    add.add_argument("--iterations", type=int, default=4096)
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input instead of a prompt",
    )
    remove = user_commands.add_parser("remove", help="remove a user")
    remove.add_argument("--credentials-file", type=Path, required=True)
    remove.add_argument("--user", required=True)
    listing = user_commands.add_parser("list", help="list users and their mechanisms")
    listing.add_argument("--credentials-file", type=Path, required=True)

    status = commands.add_parser(
        "status", help="cluster id, node id, API versions and registered brokers of a server"
    )
    status.add_argument("--bootstrap", required=True, metavar="HOST:PORT")

    sink = commands.add_parser("sink", help="the Spark sink's tables in a database")
    sink_commands = sink.add_subparsers(dest="sink_command", required=True, metavar="COMMAND")
    recover = sink_commands.add_parser(
        "recover",
        help="abort the open writes to TABLE with no batch for --older-than seconds and "
        "remove their staged rows (what the next write does by itself)",
    )
    recover.add_argument("url", metavar="URL", help="sqlite:///PATH or postgresql://...")
    recover.add_argument("table", metavar="TABLE")
    recover.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long without a batch makes a write abandoned (default 3600; 0: every open "
        "write, when you know none is running)",
    )
    versions = sink_commands.add_parser(
        "versions", help="per txnAppId (or streaming query id), the highest committed version"
    )
    versions.add_argument("url", metavar="URL")
    versions.add_argument("table", metavar="TABLE")

    kafka = commands.add_parser("kafka", help="pidctl-kafka's writes, read from the brokers")
    kafka_commands = kafka.add_subparsers(dest="kafka_command", required=True, metavar="COMMAND")
    check = kafka_commands.add_parser(
        "verify",
        help="check that a named job version's rows are in a topic once each (exit status 1 "
        "if not): repeated sequences, missing rows, rows that differ from what was written, "
        "duplicate rows",
    )
    check.add_argument(
        "--bootstrap-servers", required=True, metavar="HOST:PORT[,HOST:PORT]", help="Kafka's"
    )
    check.add_argument("--topic", required=True)
    check.add_argument("--app-id", required=True, help="the job's txnAppId (a stream: query id)")
    check.add_argument(
        "--version", type=int, required=True, help="its txnVersion (a stream: batch id)"
    )
    check.add_argument(
        "--since-ms",
        type=int,
        metavar="UNIX_MS",
        help="read from this time on (less 10 minutes for clocks); default: every partition "
        "from its start",
    )
    check.add_argument(
        "--rows", type=int, metavar="N", help="the rows the version wrote: checked too"
    )
    check.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Kafka client property: security.protocol, sasl.mechanism, sasl.jaas.config, "
        "ssl.truststore.location (repeatable)",
    )
    check.add_argument("--json", action="store_true", help="print the result as JSON")

    allocate = commands.add_parser("allocate", help="ask for a block of producer ids")
    allocate.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    allocate.add_argument("--broker-id", type=int, required=True)
    allocate.add_argument("--broker-epoch", type=int, required=True)
    return parser


def version_line() -> str:
    """``pidctl --version``: the version, which build runs (the request path compiled by
    mypyc, or interpreted) and the Python running it."""
    import platform

    from pidctl.protocol import __version__
    from pidctl.protocol.build import BUILD

    how = "compiled by mypyc" if BUILD == "compiled" else "interpreted"
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"pidctl {__version__} ({how}; {python})"


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    from pidctl.controller.settings import SETTING_NAMES

    parser.add_argument("--config", type=Path, help="TOML file of settings")
    for name in SETTING_NAMES:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, metavar="VALUE")


def _load_settings(
    args: argparse.Namespace, *, for_reload: bool = False
) -> tuple[Any, dict[str, str]]:
    """Settings from flags, environment and file; raises SettingsError naming each problem
    (``for_reload``: ReloadRefused for a config file a reload must not take)."""
    from pidctl.controller.settings import SETTING_NAMES, load_settings_with_sources

    environ: Mapping[str, str] = args.environ
    env_config = environ.get("PIDCTL_CONFIG")
    config = args.config or (Path(env_config) if env_config else None)
    flags: dict[str, Any] = {name: getattr(args, name) for name in SETTING_NAMES}
    return load_settings_with_sources(flags, environ, config, for_reload=for_reload)


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one ``pidctl`` command; ``environ`` (default ``os.environ``) is where PIDCTL_*
    settings are read from."""
    if argv is None and sys.argv[1:2] == ["serve"]:
        # SIGHUP's default action ends the process: until the server's signal watch runs
        # (after its imports, ~0.3 s), a SIGHUP (a reload asked early) is ignored instead.
        # (Only as the process's own command: a caller in process keeps its handlers.)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = build_parser().parse_args(argv)
    args.environ = os.environ if environ is None else environ
    try:
        return COMMANDS[args.command](args)
    except BaseException as e:
        if isinstance(_single(e), BrokenPipeError) and args.command != "serve":
            # Output piped into `head` and the like: stop quietly, as Unix tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        return _report(e)


def _report(error: BaseException) -> int:
    """Print an error the operator can act on as one line (a line per problem) and return
    the exit status it carries (:class:`PidctlError`; any other ``OSError``: 1); re-raise
    anything else, a bug, with its traceback."""
    single = _single(error)
    if isinstance(single, PidctlError):
        for line in single.cli_lines():
            print(f"pidctl: {line}", file=sys.stderr)
        return single.exit_code
    if isinstance(single, OSError):
        print(f"pidctl: {single}", file=sys.stderr)
        return 1
    raise error


def _config(args: argparse.Namespace) -> int:
    from pidctl.controller.settings import show_settings

    print("\n".join(show_settings(*_load_settings(args))))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pidctl.controller.settings import check_advertised

    settings = _load_settings(args)[0]
    check_advertised(settings)  # before anything is formatted or bound
    if settings.data_dir.exists() or not args.format_if_missing:
        return _run_server(args, settings)
    _format_new(settings, why=" (it did not exist; --format-if-missing)")
    try:
        return _run_server(args, settings)
    except BaseException as e:
        try:
            return _report(e)  # the failure first, then what was undone
        finally:
            _remove_if_unused(settings.data_dir)


def _run_server(args: argparse.Namespace, settings: Any) -> int:
    """``pidctl serve`` on loaded settings: 0 after a clean stop; raises what stopped it."""
    import structlog
    import trio

    from pidctl.controller.log.formatting import check_formatted
    from pidctl.controller.server.app import log_start, serve
    from pidctl.controller.server.telemetry.logs import configure_logging
    from pidctl.controller.settings import service_link_variables

    check_formatted(settings.data_dir)  # one line and nothing else when it is not
    configure_logging(settings.log_format, settings.log_level)
    log_start(settings)
    ignored = service_link_variables(args.environ)
    if ignored:
        structlog.get_logger("pidctl.settings").warning(
            "ignored Kubernetes service-link variables (not settings; enableServiceLinks: "
            "false in the pod spec drops them)",
            variables=ignored,
        )

    def reload() -> Any:
        """SIGHUP: the same flags, the environment and the config file read again (a
        SettingsError names what is wrong; the server logs it and keeps what it has)."""
        return _load_settings(args, for_reload=True)[0]

    trio.run(serve, settings, reload)
    return 0


def _format(args: argparse.Namespace) -> int:
    settings = _load_settings(args)[0]
    _format_new(settings, ignore_formatted=args.ignore_formatted, parents=args.parents)
    return 0


def _format_new(
    settings: Any, *, ignore_formatted: bool = False, parents: bool = False, why: str = ""
) -> None:
    """Format ``settings.data_dir``, saying so (and ``why``); raises what refused it (an
    already formatted data dir too, unless ``ignore_formatted``; one whose parent does not
    exist, unless ``parents``)."""
    from pidctl.controller.core.records import new_cluster_id
    from pidctl.controller.log.formatting import AlreadyFormatted, format_data_dir

    cluster_id = settings.cluster_id or new_cluster_id()
    try:
        format_data_dir(
            settings.data_dir,
            cluster_id,
            settings.node_id,
            time.time_ns() // 10**6,
            parents=parents,
        )
    except AlreadyFormatted as e:
        if not ignore_formatted:
            raise
        print(*e.cli_lines())
        return
    print(
        f"formatted {settings.data_dir}{why}: cluster id {cluster_id}, node id {settings.node_id}",
        flush=True,
    )


def _remove_if_unused(data_dir: Path) -> None:
    """After a failed start, remove the data dir this start formatted, if it holds nothing
    but its creation (the cluster and the start records): a failed start leaves nothing."""
    import shutil

    from pidctl.controller.core.records import ClusterCreated, ControllerStarted
    from pidctl.controller.log.recovery import read_log

    try:
        entries = read_log(data_dir).entries()
    except Exception:  # whatever is there, it is not ours to remove
        return
    if all(isinstance(e.record, ClusterCreated | ControllerStarted) for e in entries):
        shutil.rmtree(data_dir, ignore_errors=True)
        print(f"pidctl: the start failed: removed {data_dir}, formatted for it", file=sys.stderr)


def _import_zk(args: argparse.Namespace) -> int:
    import trio

    from pidctl.controller.server.fleet.lease_keeper import etcd_counter
    from pidctl.controller.zk_import import (
        import_into_data_dir,
        import_into_etcd,
        read_zookeeper_block,
    )

    settings = _load_settings(args)[0]
    block = read_zookeeper_block(args.zookeeper, args.znode, args.timeout)
    origin = (
        f"zookeeper {args.zookeeper}{args.znode}: broker {block.broker}, "
        f"block {block.block_start}..{block.block_end}"
    )
    print(f"read {origin}")
    if settings.pid_source:

        async def to_etcd() -> str:
            counter = etcd_counter(settings)
            try:
                return await import_into_etcd(counter, block)
            finally:
                await counter.aclose()

        print(trio.run(to_etcd))
    else:
        print(
            import_into_data_dir(
                settings.data_dir,
                block,
                origin,
                node_id=settings.node_id,
                cluster_id=settings.cluster_id,
            )
        )
    return 0


def _sink(args: argparse.Namespace) -> int:
    from pidctl.spark.sqlstore import check_identifier, open_store

    try:
        store = open_store(args.url)
        check_identifier(args.table)
    except ImportError as e:
        raise PidctlError(f"{e.name} is needed for {args.url} (pip install 'pidctl[spark]')") from e
    except ValueError as e:
        raise UsageError(str(e)) from e
    try:
        if args.sink_command == "recover":
            if args.older_than < 0:
                raise UsageError("--older-than must not be negative")
            aborted = store.recover(args.table, args.older_than)
            for write_id in aborted:
                print(f"aborted the abandoned write {write_id}; its staged rows are removed")
            print(f"{len(aborted)} abandoned write(s) to {args.table}")
        else:
            for app_id, version in sorted(store.committed_versions(args.table).items()):
                print(f"{app_id}\t{version}")
    except PidctlError:
        raise
    except Exception as e:  # the database's own error types: one line, not a traceback
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PidctlError(f"{args.url}: {line}") from e
    finally:
        store.close()
    return 0


def _kafka(args: argparse.Namespace) -> int:
    try:
        from pidctl.spark.kafka_verify import verify
    except ImportError as e:
        raise PidctlError(f"{e.name} is needed to read Kafka (pip install 'pidctl[spark]')") from e
    properties = {}
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--property must be KEY=VALUE, got {item!r}")
        properties[key.strip().lower()] = value
    servers = [s.strip() for s in args.bootstrap_servers.split(",") if s.strip()]
    try:
        verdict = verify(
            servers,
            args.topic,
            args.app_id,
            args.version,
            properties=properties,
            since_ms=args.since_ms,
            expected_rows=args.rows,
        )
    except ValueError as e:
        raise UsageError(str(e)) from e
    except (OSError, RuntimeError) as e:
        raise PidctlError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
    if args.json:
        print(json.dumps(verdict.as_dict()))
    else:
        print("\n".join(verdict.lines()))
    return 0 if verdict.ok else 1


def _single(error: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (trio's nurseries)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _progress(label: str) -> Any:
    """A progress bar on stderr for long reads, when stderr is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        sys.stderr.write(f"\r{label} [{bar:<30}] {share:4.0%}")
        if done >= total:
            sys.stderr.write("\r" + " " * (len(label) + 40) + "\r")
        sys.stderr.flush()

    return show


def _corrupt(error: Exception) -> PidctlError:
    """The ``log`` commands say CORRUPT before a corruption found in the data dir they read."""
    return PidctlError(f"CORRUPT: {error}")


def _log(args: argparse.Namespace) -> int:
    from pidctl.controller.core.logformat import LogCorruption
    from pidctl.controller.log.logtools import (
        DumpFilter,
        format_dump,
        parse_time,
        removed_before,
        removed_note,
        selected,
        summary_lines,
        verify,
    )
    from pidctl.controller.log.recovery import reserve_by_operator

    if args.log_command == "reserve":
        if args.producer_id < 0:
            raise UsageError("--producer-id must not be negative")
        last = args.last_producer_id
        if last is None:  # the setting, from the environment or its default
            from pidctl.controller.settings import load_settings_with_sources

            name = "PIDCTL_LAST_PRODUCER_ID"
            wanted = {name: args.environ[name]} if name in args.environ else {}
            last = load_settings_with_sources({}, wanted)[0].last_producer_id
        try:
            print(
                reserve_by_operator(
                    args.data_dir, args.producer_id, last_producer_id=last, force=args.force
                )
            )
        except LogCorruption as e:
            raise _corrupt(e) from e
        return 0
    if args.log_command == "dump":
        if not args.data_dir.is_dir():
            raise PidctlError(f"{args.data_dir}: no such data dir")
        try:
            keep = DumpFilter(
                args.broker,
                parse_time(args.since) if args.since else None,
                parse_time(args.until) if args.until else None,
            )
        except ValueError as e:
            raise UsageError(f"--since/--until: {e}") from e
        try:
            contents, entries = selected(args.data_dir, keep, _progress("reading"))
            removed = removed_before(contents)
            if args.summary:
                lines = [f"# {removed_note(removed)}"] if removed else []
                lines += summary_lines(entries)
            else:
                lines = list(format_dump(contents, entries, args.json))
                if args.json and removed:  # stdout stays one JSON object per line
                    print(f"pidctl: {removed_note(removed)}", file=sys.stderr)
            for line in lines:
                print(line)
        except LogCorruption as e:
            raise _corrupt(e) from e
        except BrokenPipeError:
            sys.stderr.close()
        return 0
    report = verify(args.data_dir, _progress("verifying"))
    for line in report.lines:
        print(line)
    return 0 if report.ok else 1


def _register(args: argparse.Namespace) -> int:
    from pidctl.client import SyncClient
    from pidctl.protocol import requests

    try:
        with SyncClient(args.bootstrap) as client:
            cluster_id = args.cluster_id or client.request(requests.metadata([])).cluster_id
            request = requests.registration(
                args.broker_id,
                cluster_id,
                args.incarnation_id,
                listeners=tuple(args.listener),
                rack=args.rack,
            )
            response = client.request(request)
    except ValueError as e:
        raise UsageError(str(e)) from e
    if response.error_code:
        raise PidctlError(f"registration refused: {response.error_code.name}")
    print(f"broker {args.broker_id} registered with epoch {response.broker_epoch}")
    return 0


def _users(args: argparse.Namespace) -> int:
    import getpass

    from pidctl.controller.server.security.sasl import (
        MIN_ITERATIONS,
        CredentialStore,
        ScramCredential,
    )

    try:
        store = CredentialStore.load(args.credentials_file)
    except ValueError as e:
        raise PidctlError(str(e)) from e
    if args.users_command == "list":
        for user, mechanisms in sorted(store.users.items()):
            print(f"{user}: {', '.join(sorted(mechanisms))}")
        return 0
    if args.users_command == "remove":
        if store.users.pop(args.user, None) is None:
            raise PidctlError(f"no user {args.user!r}")
        store.save(args.credentials_file)
        print(f"removed {args.user} (running servers take it on SIGHUP)")
        return 0
    if args.iterations < MIN_ITERATIONS:
        raise UsageError(f"--iterations must be at least {MIN_ITERATIONS}")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif not sys.stdin.isatty():
        raise UsageError("no terminal to ask for the password: pipe it in with --password-stdin")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
    if not password:
        raise UsageError("empty password")
    chosen: list[str] = args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    store.users[args.user] = {
        m: ScramCredential.create(password, m, args.iterations) for m in chosen
    }
    store.save(args.credentials_file)
    print(f"{args.user}: {', '.join(chosen)} (running servers take it on SIGHUP)")
    return 0


def _status(args: argparse.Namespace) -> int:
    from pidctl.client import SyncClient
    from pidctl.protocol import requests
    from pidctl.protocol.apis import ApiKey

    with SyncClient(args.bootstrap) as client:
        versions, metadata, cluster = client.pipeline(
            [requests.api_versions(), requests.metadata([]), requests.describe_cluster()]
        )
    node = metadata.brokers[0] if metadata.brokers else None
    print(f"cluster id:  {metadata.cluster_id}")
    print(f"node id:     {metadata.controller_id}")
    if node is not None:
        print(f"advertised:  {node.host}:{node.port}")
    print("api versions:")
    for api in versions.api_keys:
        try:
            name = ApiKey(api.api_key).name
        except ValueError:
            name = str(api.api_key)
        print(f"  {name:<24} {api.api_key:>3}  v{api.min_version}-v{api.max_version}")
    print(f"registered brokers: {len(cluster.brokers)}")
    for broker in cluster.brokers:
        where = f"{broker.host}:{broker.port}" if broker.port >= 0 else "(no listener)"
        fenced = "fenced" if broker.is_fenced else "active"
        print(f"  broker {broker.broker_id:<6} {where:<28} {fenced}")
    return 0


def _allocate(args: argparse.Namespace) -> int:
    from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
    from kio.schema.types import BrokerId
    from kio.static.primitive import i64

    from pidctl.client import SyncClient

    with SyncClient(args.bootstrap) as client:
        response = client.request(
            AllocateProducerIdsRequest(
                broker_id=BrokerId(args.broker_id), broker_epoch=i64(args.broker_epoch)
            )
        )
    if response.error_code:
        raise PidctlError(f"allocation refused: {response.error_code.name}")
    first = response.producer_id_start
    print(f"producer ids {first}..{first + response.producer_id_len - 1}")
    return 0


#: Each command's function: its exit status, or it raises what ended it (:func:`_report`).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "format": _format,
    "log": _log,
    "config": _config,
    "register": _register,
    "allocate": _allocate,
    "status": _status,
    "users": _users,
    "sink": _sink,
    "kafka": _kafka,
    "import-zk": _import_zk,
}


if __name__ == "__main__":
    sys.exit(main())
