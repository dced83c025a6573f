#!/usr/bin/env bash
# Install everything into .venv/ (idempotent), build the offline models, run the test suite.
#
#   scripts/test.sh                 # everything (the README's test command, and CI's)
#   scripts/test.sh --fast          # the unit tier: no engine, no server, nothing slow (about 3 minutes)
#   scripts/test.sh tests/policy -x # extra arguments go to pytest
#
# Tiers are pytest markers assigned from the fixtures a test uses (tests/conftest.py): engine, server,
# default_model, gpu, and slow by hand.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fast=0
if [ "${1:-}" = "--fast" ]; then
    fast=1
    shift
fi
scripts/install.sh
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/infercept model prepare --name tiny

# Debian packages some tests drive for real, installed where we can (root with apt); elsewhere those
# tests are skipped with the reason. apt_install PACKAGE WHY
apt_install() {
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing Debian's $1 for $2..."
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null 2>&1; } \
            || echo "warning: could not install $1; $2 will be skipped" >&2
    fi
}
# The PostgreSQL session store's tests start a server of their own (tests/pg.py).
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt_install postgresql "the PostgreSQL store tests"
fi
marks=()
if [ "$fast" = 1 ]; then
    marks=(-m "not engine and not server and not slow and not default_model and not gpu")
else
    # The web-client test drives Debian's Chromium (no browser download).
    if ! command -v chromium >/dev/null 2>&1; then
        apt_install chromium "the browser test"
    fi
    # Replicas behind a real balancer (tests/gateway/test_balancer.py).
    if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
        apt_install haproxy "the balancer test"
    fi
    .venv/bin/infercept model prepare --name default
fi
set +e
# The slowest tests are listed at the end, so a CI log shows where the time goes.
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${marks[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": this suite always has tests, so that means a broken collection (or
    # arguments that select nothing).
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
