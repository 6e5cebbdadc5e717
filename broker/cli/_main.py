"""The `magnetar` command line.

Each subcommand lives in a small `_cmd_*` function that imports what it needs lazily, so
`magnetar --help` stays fast and a subcommand's heavy dependencies (matplotlib, the
pulsar client) load only when that subcommand runs. The harness commands (`crashtest`,
`bench storage`) need packages a plain install leaves out (pyproject.toml's `crashtest` and
`bench` extras); they check for them before doing any work and name the extra to install
(`_missing_extra`, exit status 2).

Errors reach the user as one line on stderr, never a traceback: argument errors as
`magnetar <command>: <what is wrong> (see magnetar <command> --help)` with exit status 2
(`_Parser`), and the errors of our packages that a handler lets through (`main`'s
boundary: `BrokerError`, `StorageError`, the admin API's `AdminHttpError`, `OSError`) as
`magnetar <command>: <message>`, exit status 2 for bad input (a setting out of range, an
invalid topic or namespace name or message id) and 1 otherwise. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]
T = TypeVar("T")

EXIT_FAILED = 1  # the command ran and failed (unreachable broker, locked directory, ...)
EXIT_USAGE = 2  # the command line asked for something invalid
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
PORT_MAX = 65535
EXTRA_CRASHTEST = "crashtest"  # pyproject.toml's extra for `magnetar crashtest`: tqdm
CRASHTEST_ITERATIONS_DEFAULT = {"storage": 100, "broker": 20}  # a broker crash takes seconds
EXTRA_BENCH = "bench"  # ... for `magnetar bench storage`: tqdm, and matplotlib for --plot


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: not a number") from None
    if not 0 <= port <= PORT_MAX:
        raise argparse.ArgumentTypeError(
            f"invalid port {port}: must be from 0 (any free port) to {PORT_MAX}")
    return port


def _seconds(text: str) -> float:
    """A duration in seconds for argparse: a finite number, not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: must be a number of seconds, 0 or more")
    return value


def _url(scheme: str) -> Callable[[str], str]:
    """An argparse type for `SCHEME://HOST:PORT` URLs."""

    def parse(text: str) -> str:
        from magnetar.broker._listeners import is_service_url

        if not is_service_url(text, scheme):
            raise argparse.ArgumentTypeError(
                f"invalid URL {text!r}: expected {scheme}://HOST:PORT")
        return text

    return parse


def _positive_int(text: str) -> int:
    """A count for argparse: at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid number {value}: must be at least 1")
    return value


def _cmd_storage_check(args: argparse.Namespace) -> int:
    from magnetar.storage import check_data_dir

    report = _read_data_dir("check", check_data_dir, args.data_dir)
    if report is None:
        return 2
    print(report.render())
    return 0 if report.ok else 1


def _cmd_storage_inspect(args: argparse.Namespace) -> int:
    import lmdb

    from magnetar.storage import inspect_data_dir

    try:
        report = _read_data_dir("inspect", inspect_data_dir, args.data_dir)
    except lmdb.Error as exc:
        print(f"magnetar storage inspect: the index of {args.data_dir} is unreadable "
              f"({type(exc).__name__}: {exc}); run `magnetar storage check`", file=sys.stderr)
        return 2
    if report is None:
        return 2
    print(report.render())
    return 0


def _read_data_dir(what: str, read: Callable[[str], T], data_dir: str) -> T | None:
    """Run a read-only storage tool; None (after one line on stderr) when the directory
    is held by a live process or cannot be read."""
    from magnetar.storage import DataDirLockedError

    try:
        return read(data_dir)
    except DataDirLockedError as exc:
        print(f"magnetar storage {what}: {exc}, which is running; stop it first "
              "(nothing was read)", file=sys.stderr)
    except OSError as exc:
        print(f"magnetar storage {what}: cannot read {data_dir}: "
              f"{exc.strerror or exc}", file=sys.stderr)
    return None


def _missing_extra(command: str, modules: Sequence[str], extra: str) -> bool:
    """Whether a module `command` needs is not installed; if so, print one line naming the
    missing modules and the extra that installs them (nothing has been done yet)."""
    import importlib.util

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return False
    print(f"{command}: needs {' and '.join(missing)}, which this installation lacks; install "
          f"the {extra!r} extra: pip install 'magnetar[{extra}]' (nothing was run)",
          file=sys.stderr)
    return True


def _cmd_crashtest(args: argparse.Namespace) -> int:
    if _missing_extra("magnetar crashtest", ["tqdm"], EXTRA_CRASHTEST):
        return EXIT_USAGE
    if args.target == "broker":
        return _crashtest_broker(args)
    if args.data_dir is None:
        print("magnetar crashtest: the following arguments are required: --data-dir (see "
              "magnetar crashtest --help)", file=sys.stderr)
        return EXIT_USAGE
    from magnetar.storage.testing.crashtest import CrashTestOptions, run_crashtest

    options = CrashTestOptions(
        data_dir=args.data_dir,
        iterations=args.iterations or CRASHTEST_ITERATIONS_DEFAULT["storage"],
        seed=args.seed,
        mode=args.mode,
        progress=not args.no_progress,
    )
    summary = run_crashtest(options)
    return 0 if summary.violations == 0 else 1


def _crashtest_broker(args: argparse.Namespace) -> int:
    """`magnetar crashtest broker`: in --data-dir, or in a temporary directory that is
    removed after a run without violations (and kept, and named, after one with)."""
    import shutil
    import tempfile

    from magnetar.broker.testing.crashtest import BrokerCrashTestOptions, run_broker_crashtest

    data_dir = args.data_dir or tempfile.mkdtemp(prefix="magnetar-crashtest-broker-")
    options = BrokerCrashTestOptions(
        data_dir=data_dir,
        iterations=args.iterations or CRASHTEST_ITERATIONS_DEFAULT["broker"],
        seed=args.seed,
        mode=args.mode,
        progress=not args.no_progress,
    )
    summary = run_broker_crashtest(options)
    if args.data_dir is None:
        if summary.violations == 0:
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            print(f"magnetar crashtest broker: data directories kept in {data_dir}")
    return 0 if summary.violations == 0 else 1


def _cmd_bench_storage(args: argparse.Namespace) -> int:
    needs = ["tqdm", "matplotlib"] if args.plot else ["tqdm"]
    if _missing_extra("magnetar bench storage", needs, EXTRA_BENCH):
        return EXIT_USAGE
    from magnetar.storage.testing.benchmark import BenchOptions, run_storage_benchmark

    options = BenchOptions(
        directory=args.dir,
        quick=args.quick,
        json_path=args.json,
        plot_path=args.plot,
    )
    run_storage_benchmark(options)
    return 0


def _cmd_standalone(args: argparse.Namespace) -> int:
    import os

    from magnetar.broker.cli._config_file import (
        build,
        from_environment,
        from_file,
        from_flags,
        from_overrides,
        merge,
        render,
    )
    from magnetar.broker.cli._standalone import (
        GC_YOUNG_THRESHOLD,
        GIL_SWITCH_INTERVAL_S,
        run_standalone,
    )

    # ConfigurationError from any of these: main's one line, exit status 2.
    values = merge(from_file(args.config_file) if args.config_file else {},
                   from_environment(os.environ), from_overrides(args.config),
                   from_flags(_standalone_flags(args)))
    options = build(values, data_dir_needed=not args.print_config)
    if args.print_config:
        print(render(values))
        return 0
    # What is loaded by now (about 60,000 objects the cyclic GC tracks: modules, classes,
    # protobuf descriptors) lives as long as the process. A full collection holds the GIL
    # while it walks everything it tracks; at 5,000 msg/s one ran every few seconds, a
    # publish-latency stall of 10 ms or more each (issue 14). Frozen, they are not walked.
    gc.freeze()
    # Fewer, later young collections (see GC_YOUNG_THRESHOLD).
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    # Hand the GIL over sooner when another thread waits for it (see GIL_SWITCH_INTERVAL_S).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return run_standalone(options)


# The dedicated flags of `magnetar standalone`: (argparse dest, the setting's key). A flag not
# given (None; False for a switch) leaves the setting to the file, the environment or --config.
_FLAG_KEYS = (("data_dir", "dataDir"), ("host", "bindAddress"), ("port", "brokerServicePort"),
              ("http_port", "webServicePort"), ("advertised_url", "advertisedUrl"),
              ("advertised_url_tls", "advertisedUrlTls"), ("tls_port", "brokerServicePortTls"),
              ("https_port", "webServicePortTls"),
              ("keepalive_interval_s", "keepAliveIntervalSeconds"),
              ("max_pending_sends", "maxPendingPublishRequestsPerConnection"),
              ("shutdown_grace_s", "brokerShutdownTimeoutMs"),
              ("internal_listener_name", "internalListenerName"),
              ("tls_cert_file", "tlsCertificateFilePath"), ("tls_key_file", "tlsKeyFilePath"),
              ("tls_trust_certs_file", "tlsTrustCertsFilePath"))


def _standalone_flags(args: argparse.Namespace) -> list[tuple[str, object, str]]:
    """(key, value in the setting's field unit, flag) for each dedicated flag given."""
    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    found: list[tuple[str, object, str]] = [
        (key, getattr(args, dest), flag(dest)) for dest, key in _FLAG_KEYS
        if getattr(args, dest) is not None]
    if args.advertised_listeners is not None:
        listeners = tuple(part.strip() for part in args.advertised_listeners.split(",")
                          if part.strip())
        found.append(("advertisedListeners", listeners, "--advertised-listeners"))
    for dest, key in (("skip_corrupt_journal_segments", "skipCorruptJournalSegments"),
                      ("tls_require_trusted_client_cert",
                       "tlsRequireTrustedClientCertOnConnect")):
        if getattr(args, dest):
            found.append((key, True, flag(dest)))
    for dest, key in (("auth_token_secret_key", "tokenSecretKey"),
                      ("auth_token_public_key", "tokenPublicKey")):
        if getattr(args, dest):
            found += [(key, getattr(args, dest), flag(dest)),
                      ("authenticationEnabled", True, flag(dest))]
    return found


def _add_standalone(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    standalone = sub.add_parser(
        "standalone",
        help="run the broker: Pulsar's binary protocol on one data directory",
        description="Run the standalone broker until SIGTERM or SIGINT. Official Pulsar "
        "clients connect to pulsar://HOST:PORT. The first signal shuts down gracefully "
        "(in-flight publishes are persisted and acknowledged); a second one exits at once.",
    )
    standalone.add_argument("--config-file", default=None, metavar="PATH", help="read "
                            "settings from this file: Pulsar's standalone.conf format and key "
                            "names (key=value lines, # comments; unknown keys are warned about "
                            "and ignored); MAGNETAR_<key> environment variables override it, "
                            "--config and the flags override both")
    standalone.add_argument("--print-config", action="store_true", help="print every setting "
                            "(key, value, default, unit, meaning) as the file, environment and "
                            "flags make it, in --config-file format, and exit")
    standalone.add_argument("--data-dir", default=None, help="the data directory (created "
                            "when missing; or dataDir in --config-file)")
    standalone.add_argument("--host", default=None, help="bind address (default "
                            "127.0.0.1)")
    standalone.add_argument("--port", type=_port, default=None, help="binary protocol port "
                            "(default 6650; 0 picks a free one)")
    standalone.add_argument("--http-port", type=_port, default=None, help="admin HTTP port; it "
                            "also answers the lookups of clients given http://HOST:PORT as their "
                            "service URL (default 8080)")
    standalone.add_argument("--advertised-url", type=_url("pulsar"), default=None,
                            help="the URL lookups answer "
                            "with (default pulsar://HOST:PORT)")
    standalone.add_argument("--advertised-listeners", default=None,
                            metavar="NAME:URL,...", help="named routes to the broker, e.g. "
                            "internal:pulsar://10.0.0.5:6650,external:pulsar://example.com:6650"
                            " (add NAME:pulsar+ssl://HOST:PORT per listener with --tls-port); "
                            "lookups answer the listener a client names (its listener_name) "
                            "and fail for a name not listed (Pulsar's advertisedListeners; "
                            "not with --advertised-url)")
    standalone.add_argument("--internal-listener-name", default=None, metavar="NAME",
                            help="the listener whose URLs are the broker's own, answered "
                            "when a client names none (default: the first one listed; "
                            "Pulsar's internalListenerName)")
    standalone.add_argument("--keepalive-interval-s", type=_seconds, default=None,
                            metavar="SECONDS", help="the broker PINGs each connection this "
                            "often and closes one that sent nothing for a whole interval "
                            "after a PING (Pulsar's keepAliveIntervalSeconds; default 30; "
                            "0 disables broker PINGs and the idle timeout)")
    standalone.add_argument("--max-pending-sends", type=_positive_int, default=None,
                            metavar="N",
                            help="SENDs awaiting their receipts per connection before the "
                            "broker stops reading that connection until receipts go out "
                            "(Pulsar's maxPendingPublishRequestsPerConnection; default 1000)")
    standalone.add_argument("--shutdown-grace-s", type=_seconds, default=None,
                            metavar="SECONDS", help="at SIGTERM/SIGINT, how long the commands "
                            "already received may take to finish before connections are "
                            "closed (default 10)")
    standalone.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                            help="override a setting by its key (see --print-config) or "
                            "field name, e.g. brokerDeduplicationEnabled=true, or "
                            "broker_entry_metadata_interceptors=timestamp,index to store "
                            "broker entry metadata with each entry (repeatable)")
    standalone.add_argument("--skip-corrupt-journal-segments", action="store_true",
                            help="start even when a journal record recovery must replay is "
                            "corrupt (valid records follow it): skip the rest of that "
                            "segment and LOSE the acknowledged data in it; the log says "
                            "how many records and bytes (default: refuse to start)")
    _add_standalone_security(standalone)
    standalone.set_defaults(handler=_cmd_standalone)


def _add_standalone_security(standalone: argparse.ArgumentParser) -> None:
    keys = standalone.add_mutually_exclusive_group()
    keys.add_argument("--auth-token-secret-key", default=None, metavar="KEY",
                      help="enable token authentication: HS tokens verified with this secret "
                      "key (a path, file:///path or data:;base64,...)")
    keys.add_argument("--auth-token-public-key", default=None, metavar="KEY",
                      help="enable token authentication: RS/ES tokens verified with this "
                      "public key (DER or PEM; a path, file:///path or data:;base64,...)")
    standalone.add_argument("--tls-port", type=_port, default=None, help="also serve "
                            "pulsar+ssl:// on this port (e.g. 6651; needs the TLS files)")
    standalone.add_argument("--advertised-url-tls", type=_url("pulsar+ssl"), default=None,
                            help="the TLS URL lookups "
                            "answer with (default pulsar+ssl://HOST:TLS_PORT)")
    standalone.add_argument("--https-port", type=_port, default=None, help="also serve the "
                            "admin API over HTTPS on this port (e.g. 8443)")
    standalone.add_argument("--tls-cert-file", default=None, help="the server certificate "
                            "(PEM, chain after it)")
    standalone.add_argument("--tls-key-file", default=None, help="its private key (PEM)")
    standalone.add_argument("--tls-trust-certs-file", default=None, help="CAs (PEM) that "
                            "client certificates must chain to")
    standalone.add_argument("--tls-require-trusted-client-cert", action="store_true",
                            help="refuse TLS clients without a trusted certificate (mTLS)")


def _add_storage(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    storage = sub.add_parser(
        "storage",
        help="inspect and verify a data directory",
        description="Tools that read a data directory without changing it (no recovery "
        "is run; they say what recovery would do) and report on what is stored there. "
        "They work on a read-only copy and refuse a directory a running broker holds.",
    )
    storage_sub = storage.add_subparsers(dest="storage_command", required=True)
    check = storage_sub.add_parser(
        "check",
        help="verify every index entry against the entry logs",
        description="Verify that every indexed entry points to a CRC-valid record of the "
        "right ledger and entry, and that every ledger's entries 0..LAC are present. "
        "Exits 1 when a problem is found.",
    )
    check.add_argument("--data-dir", required=True, help="the data directory to verify")
    check.set_defaults(handler=_cmd_storage_check)
    inspect = storage_sub.add_parser(
        "inspect",
        help="list ledgers, journal segments, the mark and entry logs",
        description="Print the ledgers (state, last-add-confirmed, metadata), the journal "
        "segments, the persisted LastLogMark and each entry log with its live ratio.",
    )
    inspect.add_argument("--data-dir", required=True, help="the data directory to inspect")
    inspect.set_defaults(handler=_cmd_storage_inspect)


def _add_crashtest(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    crash = sub.add_parser(
        "crashtest",
        help="crash the storage engine or the whole broker over and over and verify nothing "
        "acknowledged is lost",
        description="Crash-recovery harness. 'storage' (the default) crashes the storage "
        "engine: 'kill' runs a writer in a child process and SIGKILLs it at a random moment; "
        "'powerloss' runs in-process over a fault-injecting file layer that drops, tears or "
        "corrupts unsynced writes at each crash point. 'broker' crashes the whole broker under "
        "a workload of the official client (deduplicated batched and unbatched producers, "
        "Shared and Key_Shared consumers, negative acks, delayed messages, acks with "
        "receipts): 'kill' SIGKILLs a standalone broker process, 'powerloss' runs the broker "
        "in-process over the fault-injecting file layer; after each crash it restarts the "
        "broker and checks acknowledged messages, acks, cursors and deduplication. After "
        "every crash the data directory is reopened and verified. Prints the seed; the same "
        "seed replays the same workload and crash plan. Exits 1 on any violation.",
        epilog=f"Needs the {EXTRA_CRASHTEST!r} extra: pip install 'magnetar[{EXTRA_CRASHTEST}]'.",
    )
    crash.add_argument("target", nargs="?", choices=["storage", "broker"], default="storage",
                       help="what to crash (default storage)")
    crash.add_argument("--data-dir", default=None, help="scratch directory (its "
                       "crashtest-* or broker-* subdirectories are replaced; refused while a "
                       "broker or another run holds its lock); needed for storage; for broker "
                       "the default is a temporary directory, removed after a clean run")
    crash.add_argument("--iterations", type=_positive_int, default=None,
                       help=f"crashes to run (default {CRASHTEST_ITERATIONS_DEFAULT['storage']}"
                       f"; broker: {CRASHTEST_ITERATIONS_DEFAULT['broker']})")
    crash.add_argument("--seed", type=int, default=None, help="workload seed (default: random)")
    crash.add_argument("--mode", choices=["kill", "powerloss", "both"], default="both",
                       help="which crashes to simulate (default both)")
    crash.add_argument("--no-progress", action="store_true", help="no progress bar")
    crash.set_defaults(handler=_cmd_crashtest)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks measured against the disk's own limits",
        description="Benchmarks that measure the physical limits of the disk in the same run "
        "and report each figure as a ratio to them.",
    )
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    storage = bench_sub.add_parser(
        "storage",
        help="durable appends, reads and journal replay",
        description="Measure raw fsync rate and sequential bandwidth, then durable appends "
        "(100 B, 1 KB, 64 KB; 1, 16 and 256 in flight), tailing and catch-up reads, and "
        "journal replay, in a temporary directory on the disk of --dir.",
        epilog=f"Needs the {EXTRA_BENCH!r} extra (tqdm; matplotlib for --plot): "
        f"pip install 'magnetar[{EXTRA_BENCH}]'.",
    )
    storage.add_argument("--quick", action="store_true", help="a short run (seconds)")
    storage.add_argument("--dir", default=".", help="run on the disk holding this directory")
    storage.add_argument("--json", default=None, help="write the results as JSON here")
    storage.add_argument("--plot", default=None, help="write a PNG chart here")
    storage.set_defaults(handler=_cmd_bench_storage)


# Leading options of `magnetar` itself, before the command's name.
_TOP_OPTIONS = ("-v", "--verbose")


def build_parser(only_standalone: bool = False) -> argparse.ArgumentParser:
    """The whole command line; with `only_standalone`, `magnetar standalone` alone (what a
    broker's start needs: the other commands' parsers took a tenth of a second to build, and
    their modules to load, before the broker served)."""
    parser: argparse.ArgumentParser = _Parser(  # its subparsers are _Parsers too
        prog="magnetar",
        description="Magnetar: Apache Pulsar's messaging model on a BookKeeper-style storage "
        "engine, in one Python process with one data directory.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_standalone(sub)
    if only_standalone:
        return parser
    _add_storage(sub)
    _add_crashtest(sub)
    _add_bench(sub)
    from . import (  # produce, consume, topics, ...; permissions; perf; tokens
        _admin_cli,
        _perf_cli,
        _permissions_cli,
        _tokens_cli,
    )

    _admin_cli.add_commands(sub)
    _permissions_cli.add_permission_commands(sub)
    _perf_cli.add_perf_command(sub)
    _tokens_cli.add_tokens_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if word not in _TOP_OPTIONS), None)
    parser = build_parser(only_standalone=command == "standalone")
    args = parser.parse_args(words)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        status = _error_status(error)
        if status is None:
            raise
        print(f"{_command_name(args)}: {error}", file=sys.stderr)
        return status


def _error_status(error: Exception) -> int | None:
    """The exit status for an error that reached `main` (None: a bug, let it through)."""
    from magnetar.storage import StorageError

    from .._errors import BrokerError, ConfigurationError, InvalidTopicNameError
    from ._admin_cli import AdminHttpError

    if isinstance(error, ConfigurationError | InvalidTopicNameError
                  | argparse.ArgumentTypeError):  # the last: a value checked when used
        return EXIT_USAGE
    if isinstance(error, BrokerError | StorageError | AdminHttpError | OSError):
        return EXIT_FAILED
    return None


def _command_name(args: argparse.Namespace) -> str:
    """`magnetar topics create`: the words of the command that ran."""
    words = ["magnetar", args.command]
    for key, value in vars(args).items():
        if key.endswith("_command") and isinstance(value, str):
            words.append(value)
    return " ".join(words)


if __name__ == "__main__":
    sys.exit(main())
