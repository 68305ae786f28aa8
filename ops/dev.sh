#!/usr/bin/env bash
# One entry point for a fresh machine; it installs what it needs into .venv first.
#   ops/dev.sh serve [FLAGS]   start `pidctl serve` on its embedded defaults (or FLAGS); the
#                              default data dir ./pidctl-data is formatted on first use
#   ops/dev.sh test [ARGS]     lint, type-check and run the whole test suite (ARGS go to pytest),
#                              in TEST_WORKERS processes (default 2; pytest-xdist; 0: one); a
#                              `serve` running beside it must be left alone (TEST_USER_SERVER=
#                              start: it plays one on the default ports, on a machine of its own)
#   ops/dev.sh quick [ARGS]    the quick tier: lint, type-check and the unit tests that start no
#                              JVM or database, interpreted, in TEST_WORKERS processes (ARGS:
#                              pytest's, paths included; default: the tier's folders)
#   ops/dev.sh bench [ARGS]    the benchmark suite against its baselines (ARGS go to the suite)
#   ops/dev.sh demo [ARGS]     Spark's Kafka sink and pidctl-kafka side by side, an executor
#                              killed mid-write: rows and duplicates of each (python -m ops.demo)
#   ops/dev.sh fetch           fetch Apache Kafka's jars from Maven Central (test and bench do it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"  # not PIDCTL_*: those are all settings

# pytest in TEST_WORKERS processes; its "no tests collected" (5) is a failure.
run_pytest() {
    local status=0
    "$venv/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadscope "$@" || status=$?
    if [[ $status -eq 5 ]]; then
        echo "pytest collected no tests: that is a failure, not a pass" >&2
        return 1
    fi
    return "$status"
}

ensure_venv() {
    local extras="$1" stamp="$venv/.installed$1"
    if [[ ! -x "$venv/bin/python" ]]; then
        python3 -m venv "$venv"
    fi
    # The test install includes the plain one.
    if [[ -z "$extras" && -f "$venv/.installed[test]" ]]; then
        stamp="$venv/.installed[test]"
    fi
    # Install when never done here, or when pyproject.toml changed since.
    if [[ ! -f "$stamp" || "$root/pyproject.toml" -nt "$stamp" ]]; then
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e "$root$extras"
        touch "$stamp"
    fi
}

# Debian packages the tests start (etcd, ZooKeeper, PostgreSQL and its JDBC driver), Java 17
# with javac for Spark, Kafka and the Java client's test program, Maven to fetch Kafka,
# strace and valgrind; installed only when missing (needs root, as on CI machines).
ensure_debian_packages() {
    local missing=()
    command -v etcd >/dev/null || missing+=(etcd-server)
    [[ -x /usr/share/zookeeper/bin/zkServer.sh ]] || missing+=(zookeeper)
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
    java -version 2>&1 | grep -q 'version "17' || missing+=(openjdk-17-jdk-headless)
    command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
    command -v mvn >/dev/null || missing+=(maven)
    command -v strace >/dev/null || missing+=(strace)  # the storage-fault tests inject with it
    command -v faketime >/dev/null || missing+=(faketime)  # a wall clock before 1970, for real
    # util-linux (essential on Debian): TEST_USER_SERVER=start's server dies with the run.
    command -v setpriv >/dev/null || missing+=(util-linux)
    command -v valgrind >/dev/null || missing+=(valgrind)  # ops.bench.instructions (callgrind)
    # A C compiler and Python's headers: the compiled build (ops/compiled.py, mypyc) and the
    # benchmarks' load generator (ops/bench/loadgen.c).
    command -v cc >/dev/null || missing+=(gcc libc6-dev)
    local include
    include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    [[ -f "$include/Python.h" ]] || missing+=(python3-dev)
    # PostgreSQL's JDBC driver: the Spark sink's write_sql path and its df.write.jdbc baseline.
    [[ -f /usr/share/java/postgresql.jar ]] || missing+=(libpostgresql-jdbc-java)
    if (( ${#missing[@]} )); then
        echo "installing Debian packages: ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# What test, bench and fetch need: the Debian packages and the venv's test install, at once.
# Neither needs the other (pip builds no C: pyspark is its only source package, and pure
# Python), and on a fresh machine each is a minute or more of downloads. Should pip fail, the
# run stops there and apt-get ends on its own.
ensure_test_machine() {
    ensure_debian_packages &
    local debian=$!
    ensure_venv "[test]"
    wait "$debian"
}

# mypy checks the code under the names it is installed as (pidctl.*), through a tree of links
# in the venv; ops/bench, ops/testing and tests run from the checkout under their own names.
type_check() {
    local tree="$venv/mypy-src/pidctl"
    mkdir -p "$tree"
    ln -sfn "$root/protocol" "$tree/protocol"
    ln -sfn "$root/controller" "$tree/controller"
    for library in client broker spark; do
        ln -sfn "$root/ops/$library" "$tree/$library"
    done
    MYPYPATH="$venv/mypy-src" "$venv/bin/mypy" "$tree" ops/bench ops/testing tests
}

# Whether the arguments or the environment choose the data dir (or a config file that may):
# then it is the user's to format (pidctl format), not ours.
names_data_dir() {
    [[ -n "${PIDCTL_DATA_DIR:-}" || -n "${PIDCTL_CONFIG:-}" ]] && return 0
    local arg
    for arg in "$@"; do
        case "$arg" in
            --data-dir | --data-dir=* | --config | --config=*) return 0 ;;
        esac
    done
    return 1
}

# Apache Kafka (broker, controller, Java client) from Maven Central into Maven's cache
# (~/.m2), its class path kept in ~/.cache/pidctl-dev: the tests run Kafka itself.
fetch_jars() {
    "$venv/bin/python" -m ops.testing.jars
}

command="${1:-}"
shift || true
case "$command" in
    serve)
        ensure_venv ""
        # The embedded default data dir, ./pidctl-data, is formatted on first use (pidctl
        # says so, and removes it again if that start fails); a data dir chosen otherwise
        # must be made with `pidctl format` first, so a wrong path stops the start instead
        # of beginning a new cluster.
        first_use=()
        names_data_dir "$@" || first_use=(--format-if-missing)
        # Once `test` has run, the venv has hypothesis, which kio imports and whose trio
        # plugin makes trio's scheduler deterministic for tests: the server runs as an
        # installed one does, without it (ops/testing/without_hypothesis says why).
        export PYTHONPATH="$root/ops/testing/without_hypothesis${PYTHONPATH:+:$PYTHONPATH}"
        exec "$venv/bin/pidctl" serve "${first_use[@]}" "$@"
        ;;
    test)
        ensure_test_machine
        cd "$root"
        # The suite runs pidctl compiled, as the image ships it (ops/compiled.py: built into
        # build/ on first use and again after a source changed, about two minutes, nearly all
        # of it two C compiles): built beside the jars' fetch, the lint, the type check and,
        # for the whole suite, the interpreted pass, which wait on the network or need a core
        # less. (Should those fail, the build still ends, and is reused next time.)
        build_log="$(mktemp)"
        trap 'rm -f "$build_log"' EXIT  # however this ends (a failed lint included)
        "$venv/bin/python" -m ops.compiled >"$build_log" &
        build_pid=$!
        fetch_jars
        "$venv/bin/ruff" check .
        "$venv/bin/ruff" format --check .
        type_check
        # Size as a stated goal: the shipped lines and the largest classes, in CI's output;
        # a request-path class over its bound fails (ops/size.py).
        "$venv/bin/python" -m ops.size --check
        status=0
        if [[ $# -eq 0 ]]; then
            # `ops/dev.sh serve` and a pip-installed pidctl run the compiled modules
            # interpreted: their unit tests run that way too (a minute in one process, beside
            # the build), with the test that checks which build was imported. A failure here
            # still lets the compiled suite run: one run shows both.
            TEST_WORKERS=0 TEST_BUILD=interpreted run_pytest \
                tests/controller tests/protocol tests/ops/test_compiled.py || status=$?
        fi
        wait "$build_pid"
        compiled="$(cat "$build_log")"
        export PYTHONPATH="$compiled${PYTHONPATH:+:$PYTHONPATH}" TEST_BUILD=compiled
        # Two workers: the suite waits on servers, JVMs and databases some of the time (a
        # third made the Spark modules twice as slow: their JVMs need the cores), and it must
        # pass on a busy machine. A module runs on one worker (loadscope): its fixtures (a
        # Spark cluster, a Kafka broker) start once, not once per worker.
        run_pytest "$@" || status=$?
        exit "$status"
        ;;
    quick)
        # No Debian packages, jars or compile: the venv, then the tests of the sources as they
        # are that need nothing but pidctl (and etcd, for the fleet's unit tests, if present).
        ensure_venv "[test]"
        cd "$root"
        "$venv/bin/ruff" check .
        "$venv/bin/ruff" format --check .
        type_check
        if [[ $# -eq 0 ]]; then
            set -- tests/controller tests/protocol tests/ops/broker tests/ops/test_compiled.py \
                tests/test_architecture.py tests/test_docs.py -m "not slow"
        fi
        TEST_BUILD=interpreted run_pytest "$@"
        ;;
    bench)
        ensure_test_machine
        cd "$root"
        fetch_jars
        exec "$venv/bin/python" -m ops.bench.suite "$@"
        ;;
    demo)
        ensure_test_machine
        cd "$root"
        fetch_jars
        exec "$venv/bin/python" -m ops.demo "$@"
        ;;
    fetch)
        ensure_test_machine
        cd "$root"
        fetch_jars
        ;;
    *)
        echo "usage: ops/dev.sh serve [FLAGS] | quick [PYTEST ARGS] | test [PYTEST ARGS] | bench [ARGS] | demo | fetch" >&2
        exit 2
        ;;
esac
