#!/usr/bin/env bash
# One entry point for a fresh machine; it installs what it needs into .venv first.
#   ops/dev.sh serve [FLAGS]   start `pidctl serve` on its embedded defaults (or FLAGS)
#   ops/dev.sh test [ARGS]     lint, type-check and run the whole test suite (ARGS go to pytest)
#   ops/dev.sh bench [ARGS]    the benchmark suite against its baselines (ARGS go to the suite)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"  # not PIDCTL_*: those are all settings

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

command="${1:-}"
shift || true
case "$command" in
    serve)
        ensure_venv ""
        exec "$venv/bin/pidctl" serve "$@"
        ;;
    test)
        ensure_venv "[test]"
        cd "$root"
        "$venv/bin/ruff" check .
        "$venv/bin/ruff" format --check .
        "$venv/bin/mypy"
        status=0
        "$venv/bin/python" -m pytest "$@" || status=$?
        if [[ $status -eq 5 ]]; then
            echo "pytest collected no tests: that is a failure, not a pass" >&2
            exit 1
        fi
        exit "$status"
        ;;
    bench)
        ensure_venv "[test,bench]"
        if [[ ! -x /usr/share/zookeeper/bin/zkServer.sh ]]; then
            # The ZooKeeper baseline: Debian's package (needs root, as on CI machines).
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper
        fi
        cd "$root"
        exec "$venv/bin/python" -m ops.bench.suite "$@"
        ;;
    *)
        echo "usage: ops/dev.sh serve [FLAGS] | test [PYTEST ARGS] | bench [ARGS]" >&2
        exit 2
        ;;
esac
