#!/usr/bin/env bash
# Installs what pglab needs on Debian/Ubuntu, then runs the quickstart or the test suite.
#   ./setup.sh quickstart   install, then run examples/quickstart.yaml on a local 3-node lab
#   ./setup.sh test         install, then run the whole test suite
#   ./setup.sh install      install only
# Idempotent: a second call re-checks and installs nothing new. Works as root or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(postgresql postgresql-contrib fio sysstat python3 python3-venv python3-pip procps util-linux)
TEST_APT_PACKAGES=(chromium)  # the HTML report's browser test (Debian's Chromium; no downloaded browser)

sudo_cmd() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_system_packages() {
    local missing=()
    for p in "${APT_PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup: installing system packages: ${missing[*]}"
        sudo_cmd apt-get update -qq
        sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    # Debian's postgresql package starts a default cluster; pglab builds its own labs and needs none.
}

pick_python() {
    for py in python3.13 python3.12 python3.11 python3; do
        for dir in /usr/bin /usr/local/bin; do
            if [ -x "$dir/$py" ] && "$dir/$py" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
                echo "$dir/$py"; return
            fi
        done
    done
    echo "setup: Python >= 3.11 with the venv module is needed; install python3 (>= 3.11) and python3-venv." >&2
    exit 2
}

install_python_packages() {
    if [ ! -x .venv/bin/python ]; then
        "$(pick_python)" -m venv .venv
    fi
    local stamp=.venv/.pglab-installed
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
        .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
        touch "$stamp"
    fi
}

install_all() {
    install_system_packages
    install_python_packages
}

case "${1:-}" in
    install)
        install_all ;;
    quickstart)
        install_all
        exec .venv/bin/pglab run examples/quickstart.yaml --results results/quickstart ;;
    test)
        install_system_packages "${TEST_APT_PACKAGES[@]}"
        install_python_packages
        .venv/bin/ruff check src tests bench
        exec .venv/bin/python -m pytest -q tests ;;
    *)
        echo "usage: ./setup.sh quickstart | test | install" >&2
        exit 2 ;;
esac
