#!/usr/bin/env bash
# Installs what pglab needs on Debian/Ubuntu, then runs the quickstart or the test suite.
#   ./setup.sh quickstart        install the base, then run examples/quickstart.yaml on a local 3-node lab
#   ./setup.sh test              install everything (below), then run the whole test suite
#   ./setup.sh install [WHAT…]   install the base, plus any of: ha (etcd and Patroni, for target.local.ha),
#                                k8s (the Kubernetes client, for target: kubernetes), toxiproxy (built with Go, for
#                                target.local.network), cnpg-check (built with Go, checks rendered manifests),
#                                all (the four)
#   ./setup.sh kube-lab          install the base and k8s, then build the multi-node Kubernetes lab (tools/kube-lab)
# The base is what a local lab needs: PostgreSQL, fio, sysstat and pglab itself; no Go build. Idempotent: a second
# call re-checks and installs nothing new. Works as root or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")"

# gcc and the Python headers (python3.X-dev, added below for the interpreter picked) compile the log scanner
APT_PACKAGES=(postgresql postgresql-contrib fio sysstat python3 python3-venv python3-pip procps util-linux gcc)
HA_APT_PACKAGES=(etcd-server etcd-client)  # the HA lab's DCS (the ha extra and the tests)
TEST_APT_PACKAGES=(chromium)  # the HTML report's browser test (Debian's Chromium; no downloaded browser)
# The Kubernetes lab the tests run pglab's Kubernetes target on (tools/kube-lab): containerd, runc and the CNI
# plugins run its pods; mmdebstrap makes its images from Debian's packages; e2fsprogs and xfsprogs format the nodes'
# disks; the rest are what kubelet and kube-proxy call.
KUBE_LAB_APT_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack socat ethtool ebtables ipset
                       kmod iproute2 mmdebstrap openssl curl e2fsprogs xfsprogs)
# Toxiproxy shapes the replication links (latency, bandwidth). It is built from the Go module proxy (no release
# download), checksum-verified by the Go checksum database. v2.8.0 is the newest whose go.mod and dependencies
# build with Go 1.19, Debian 12's golang-go (v2.9.0 needs Go 1.22).
TOXIPROXY_VERSION=v2.8.0
GO_MIN_MINOR=19
# cnpg-check (tools/cnpg-check) strictly decodes rendered Kubernetes manifests into CloudNativePG's published Go
# types; its modules (github.com/cloudnative-pg/api v1.29.0, k8s.io/api v0.35.3) need Go >= 1.25. An older system
# Go fetches this pinned toolchain from the module proxy (golang.org/toolchain, checksum-verified by GOSUMDB)
# into .tools/go; nothing is installed system-wide.
CNPG_CHECK_GO_MIN_MINOR=25
CNPG_CHECK_TOOLCHAIN=go1.25.5

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
        # Debian's etcd-server starts a system etcd on the default ports. pglab's HA labs start their own etcd on free
        # ports with data under the lab, so one installed here is stopped and disabled (one that was installed
        # before is someone else's and left alone).
        if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
            sudo_cmd systemctl disable --now etcd.service >/dev/null 2>&1 || true
        fi
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

install_python_headers() {
    # Python.h of the interpreter .venv was made from, for the log scanner's compilation: Debian's python3.X-dev
    # for a Debian interpreter (one built by hand has its headers)
    local py=.venv/bin/python include pkg
    include="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    [ -f "$include/Python.h" ] && return 0
    pkg="$("$py" -c 'import sys; print("python%d.%d-dev" % sys.version_info[:2])')"
    echo "setup: installing $pkg (Python's headers, to compile the log scanner)"
    sudo_cmd apt-get update -qq
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
}

install_python_packages() {
    # pglab and the Python extras named (pyproject.toml: test, k8s, ha); the stamp holds every extra installed so
    # far, so asking for fewer later installs nothing and asking for one more installs it.
    if [ ! -x .venv/bin/python ]; then
        "$(pick_python)" -m venv .venv
    fi
    install_python_headers
    local stamp=.venv/.pglab-installed have want built
    have="$(cat "$stamp" 2>/dev/null || true)"
    want="$(for e in ${have//,/ } "$@"; do echo "$e"; done | sort -u | paste -sd, -)"
    # the log scanner is compiled at install (setup.py): a changed source, or no module built, installs again
    built=(src/pglab/workloads/_txscan.*.so)  # the pattern itself when none is there
    if [ ! -f "$stamp" ] || [ "$want" != "$have" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] \
            || [ setup.py -nt "$stamp" ] || [ src/pglab/workloads/_txscan.pyx -nt "$stamp" ] || [ ! -e "${built[0]}" ]; then
        echo "setup: installing pglab into .venv${want:+ with $want}"
        .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
        .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".${want:+[$want]}"
        echo "$want" > "$stamp"
    fi
}

go_in_tools() {
    # Every cache, download, temporary and telemetry file of the Go build stays in .tools/go; the user's go env
    # file (a proxy setting, say) is still read.
    local tools="$PWD/.tools/go"
    mkdir -p "$tools/tmp"
    env GOENV="${GOENV:-${XDG_CONFIG_HOME:-${HOME:-/nonexistent}/.config}/go/env}" XDG_CONFIG_HOME="$tools/config" \
        GOPATH="$tools" GOMODCACHE="$tools/pkg/mod" GOCACHE="$tools/cache" GOTMPDIR="$tools/tmp" GOBIN="$tools/bin" \
        GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0 "$@"
}

find_go() {
    # A go new enough (default: for the pinned toxiproxy): the one on PATH, else one the distribution installed.
    local g v min="${1:-$GO_MIN_MINOR}"
    for g in "$(command -v go || true)" /usr/lib/go/bin/go /usr/lib/go-1.*/bin/go; do
        [ -n "$g" ] && [ -x "$g" ] || continue
        v="$(go_in_tools "$g" env GOVERSION 2>/dev/null)" || continue
        if [[ "$v" =~ ^go1\.([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge "$min" ]; then
            echo "$g"; return 0
        fi
    done
    return 1
}

install_go() {
    echo "setup: installing Go from the distribution (golang-go), to build toxiproxy"
    sudo_cmd apt-get update -qq
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    find_go >/dev/null && return 0
    # A release whose golang-go is older (Ubuntu 22.04: 1.18) has newer ones as golang-1.NN-go.
    local pkg
    pkg="$(apt-cache pkgnames golang-1. | grep -E '^golang-1\.[0-9]+-go$' | sort -V | tail -n 1 || true)"
    if [ -n "$pkg" ]; then
        sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
    fi
}

install_toxiproxy() {
    local bin=.tools/bin/toxiproxy-server go
    if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "toxiproxy-server version ${TOXIPROXY_VERSION#v}" ]; then
        return
    fi
    go="$(find_go)" || { install_go; go="$(find_go)"; } || {
        echo "setup: Go >= 1.$GO_MIN_MINOR is needed to build toxiproxy; install golang-go (>= 1.$GO_MIN_MINOR)." >&2
        exit 2
    }
    local module=github.com/Shopify/toxiproxy/v2
    echo "setup: building toxiproxy-server $TOXIPROXY_VERSION with $(go_in_tools "$go" env GOVERSION) (once, 1-2 min)"
    go_in_tools "$go" install -trimpath -ldflags "-s -w -X $module.Version=${TOXIPROXY_VERSION#v}" \
        "$module/cmd/server@$TOXIPROXY_VERSION"
    mkdir -p .tools/bin
    mv -f .tools/go/bin/server "$bin"
    rm -rf .tools/go/cache .tools/go/tmp  # the build cache (~100 MB) is not needed again; the verified sources stay
}

pinned_toolchain() {
    # The pinned Go toolchain as a module (what GOTOOLCHAIN=goX.Y.Z does, but also from Go 1.19): downloaded into
    # .tools/go/pkg/mod and verified against the checksum database; module zips carry no modes, hence the chmod.
    local base="$1" arch dir
    case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
    dir="$(go_in_tools "$base" mod download -json "golang.org/toolchain@v0.0.1-$CNPG_CHECK_TOOLCHAIN.linux-$arch" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -n "$dir" ] && [ -f "$dir/bin/go" ] || return 1
    chmod -R u+x "$dir/bin" "$dir/pkg/tool"
    echo "$dir/bin/go"
}

install_cnpg_check() {
    # Rebuilt when its sources change (the stamp holds their digest); the module sources stay in .tools/go.
    local bin=.tools/bin/cnpg-check stamp=.tools/bin/.cnpg-check.sources digest go
    digest="$(cat tools/cnpg-check/go.mod tools/cnpg-check/go.sum tools/cnpg-check/*.go | sha256sum | cut -d' ' -f1)"
    if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$digest" ]; then
        return
    fi
    go="$(find_go "$CNPG_CHECK_GO_MIN_MINOR")" || go="$(pinned_toolchain "$(find_go)")" || {
        echo "setup: could not fetch Go $CNPG_CHECK_TOOLCHAIN from the module proxy to build cnpg-check." >&2
        exit 2
    }
    echo "setup: building cnpg-check with $(go_in_tools "$go" env GOVERSION) (once, 1-2 min)"
    mkdir -p .tools/bin
    (cd tools/cnpg-check && go_in_tools "$go" build -trimpath -ldflags "-s -w" -o "../../$bin" .)
    echo "$digest" > "$stamp"
    rm -rf .tools/go/cache .tools/go/tmp
}

lab_go() {
    local go
    # the go the lab's builds start from (stdout: its path alone)
    go="$(find_go)" || { install_go >&2; go="$(find_go)"; } || {
        echo "setup: Go >= 1.$GO_MIN_MINOR is needed to build the Kubernetes lab; install golang-go." >&2
        exit 2
    }
    echo "$go"
}

install_kube_lab_images() {
    # Kubernetes, etcd, CloudNativePG and CoreDNS from the Go module proxy, images from Debian's packages, all in the
    # lab cache outside the checkout (~15 min the first time on 2 cores, seconds when the cache has this build).
    local go
    go="$(lab_go)"
    PGLAB_KUBE_LAB_IMAGES="$(tools/kube-lab/build.sh "$go" | tail -n 1)"
    export PGLAB_KUBE_LAB_IMAGES
}

install_kube_lab() {
    # The lab, then what it starts only when asked (~30 min the first time on 2 cores, seconds from the cache).
    local go
    install_kube_lab_images
    go="$(lab_go)"
    # The object store (versitygw) and CloudNativePG's Barman Cloud plugin, which `kubelab.py objectstore` starts in a
    # running lab for the backup and WAL-archiving tests (~15 min the first time on 2 cores; it needs the lab's
    # kubectl, so after build.sh)
    PGLAB_KUBE_LAB_OBJECTSTORE="$(tools/kube-lab/objectstore/build.sh "$go" | tail -n 1)"
    export PGLAB_KUBE_LAB_OBJECTSTORE  # this checkout's build, not whichever another checkout made last
}

ensure_plan_user() {
    # pglab run as root runs the plan's code (pgbench, a custom script's \shell) as this unprivileged user, which
    # owns nothing (the server user, postgres, owns the data directories); PGLAB_PLAN_USER names another
    if ! getent passwd pglab-run >/dev/null; then
        echo "setup: creating the system user pglab-run (pglab as root runs the plans' pgbench scripts as it)"
        sudo_cmd useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pglab-run
    fi
}

install_base() {
    # $1: Python extras (comma-separated, may be empty); the rest: more system packages
    local extras="$1"
    shift
    install_system_packages "$@"
    install_python_packages ${extras//,/ }
    ensure_plan_user
}

next_command() {
    echo "setup: done. Next: .venv/bin/pglab run examples/quickstart.yaml   (or '. .venv/bin/activate', then pglab -h)"
}

build_beside() {
    # $1: a name, $2: a build script of the lab's (GO its argument, the build's folder its output's last line). Run at
    # the lowest priority; <name>.path holds the folder once built, <name>.failed the exit code otherwise, both in
    # $PGLAB_KUBE_LAB_BUILDING, where the tests that need the build wait for them (tests/kube_lab_support.py).
    local name="$1" script="$2" out rc=0
    out="$(nice -n 19 "$script" "$(lab_go)" 2>"$PGLAB_KUBE_LAB_BUILDING/$name.log" | tail -n 1)" || rc=$?
    if [ "$rc" -eq 0 ] && [ -n "$out" ]; then
        echo "$out" >"$PGLAB_KUBE_LAB_BUILDING/$name.tmp" && mv "$PGLAB_KUBE_LAB_BUILDING/$name.tmp" \
            "$PGLAB_KUBE_LAB_BUILDING/$name.path"
    else
        [ "$rc" -ne 0 ] || rc=1  # no folder printed
        echo "$rc" >"$PGLAB_KUBE_LAB_BUILDING/$name.failed"
    fi
}

kube_track() {
    # The Kubernetes lab's build (seconds from its cache, ~15 min from nothing on 2 cores: Go builds) and then its
    # tests (~35 min, mostly waiting on the cluster). The local tests need none of it: they start at once beside it.
    # The object store and Prometheus (~25 min more of Go builds from nothing) are built beside the lab's first tests,
    # which wait on the cluster more than they compute; the backup test and the tests with a Prometheus wait for them.
    local building builds f rc=0
    install_kube_lab_images
    building="$(mktemp -d)"
    export PGLAB_KUBE_LAB_BUILDING="$building"
    { build_beside objectstore tools/kube-lab/objectstore/build.sh
      build_beside prometheus tools/kube-lab/prometheus/build.sh; } &
    builds=$!
    .venv/bin/python -m pytest -q -m kube_lab --durations=20 tests || rc=$?  # the track's slowest tests in every log
    wait "$builds" || true  # not left running: the next run's cache gets them
    for f in "$building"/*.log; do  # what the builds beside the tests printed (their times)
        echo "setup: $(basename "$f" .log) built beside the lab's tests:"; tail -n 3 "$f"
    done
    rm -rf "$building"
    return "$rc"
}

run_tests() {
    # Everything but the quiet tests at once, each part in a process of its own whose output is printed at the end:
    # ruff and mypy; the Kubernetes lab's build and tests; the local tests in two pytest processes, those of the
    # files in `waiting` (they mostly wait out deadlines: frozen or killed processes, failovers, signals) beside the
    # rest. Then the tests that compare performance figures with each other (marker quiet), alone. The exit code is
    # the worst of them all. Why this split, and what it saves: docs/testing.md, "Where the local tests' time goes".
    local -a waiting=(tests/test_chaos.py tests/test_interrupt.py tests/test_scenarios.py tests/test_cluster_cli.py
                      tests/test_ha.py tests/test_faults.py tests/test_resume.py)
    local -a others=() pids=() parts=(kube waiting lint)
    local -a titles=("the Kubernetes lab's build and tests" "the local tests that mostly wait (${waiting[*]#tests/})"
                     "ruff and mypy")
    local f i rc logs status=0
    for f in "${waiting[@]}"; do others+=("--ignore=$f"); done
    logs="$(mktemp -d)"
    # The Kubernetes track first, the longest (~30 min): the local tools it does not use (Toxiproxy, cnpg-check: a
    # minute of Go builds in a fresh checkout) are built beside it, before the local tests that need them.
    kube_track >"$logs/kube" 2>&1 &
    pids+=($!)
    trap "kill ${pids[*]} 2>/dev/null || true" EXIT
    install_toxiproxy
    install_cnpg_check
    # The waiting tests have a lab registry of their own (PGLAB_STATE_DIR): a pglab of the others would clean up the
    # lab a test of theirs left behind on purpose (a killed pglab's), and the others' `pglab lab clean` would too.
    # --durations: each process's slowest tests in every run's log (issue 32, docs/testing.md)
    PGLAB_STATE_DIR="$logs/state" .venv/bin/python -m pytest -q -m "not kube_lab and not quiet" --durations=15 \
        "${waiting[@]}" >"$logs/waiting" 2>&1 &
    pids+=($!)
    { .venv/bin/ruff check src tests bench tools && .venv/bin/mypy; } >"$logs/lint" 2>&1 &  # mypy: pyproject.toml
    pids+=($!)
    trap "kill ${pids[*]} 2>/dev/null || true" EXIT
    .venv/bin/python -m pytest -q -m "not kube_lab and not quiet" --durations=30 "${others[@]}" tests || status=$?
    for i in "${!parts[@]}"; do
        rc=0
        wait "${pids[i]}" || rc=$?
        echo "setup: ${titles[i]}, run beside the others (exit $rc):"
        cat "$logs/${parts[i]}"
        if [ "$rc" -gt "$status" ]; then status=$rc; fi
    done
    trap - EXIT
    # a lab a failed waiting test left behind, which the next pglab would not find in the default registry
    PGLAB_STATE_DIR="$logs/state" .venv/bin/pglab lab clean || true
    rm -rf "$logs"
    rc=0
    .venv/bin/python -m pytest -q -m quiet tests || rc=$?
    if [ "$rc" -gt "$status" ]; then status=$rc; fi
    exit "$status"
}

case "${1:-}" in
    install)
        shift
        extras="" apt=() toxiproxy=0 cnpg_check=0
        for what in "$@"; do
            case "$what" in
                ha) extras+=",ha"; apt+=("${HA_APT_PACKAGES[@]}") ;;
                k8s) extras+=",k8s" ;;
                toxiproxy) toxiproxy=1 ;;
                cnpg-check) cnpg_check=1 ;;
                all) extras+=",ha,k8s"; apt+=("${HA_APT_PACKAGES[@]}"); toxiproxy=1; cnpg_check=1 ;;
                *) echo "setup: install: '$what' is not one of ha, k8s, toxiproxy, cnpg-check, all" >&2; exit 2 ;;
            esac
        done
        install_base "${extras#,}" "${apt[@]}"
        if [ "$toxiproxy" -eq 1 ]; then install_toxiproxy; fi
        if [ "$cnpg_check" -eq 1 ]; then install_cnpg_check; fi
        next_command ;;
    quickstart)
        install_base ""
        rc=0
        .venv/bin/pglab run examples/quickstart.yaml || rc=$?  # into results/quickstart, its plan's name
        echo "setup: next: .venv/bin/pglab report results/quickstart --html report.html   (or pglab -h)"
        exit "$rc" ;;
    kube-lab)
        install_base "k8s" "${KUBE_LAB_APT_PACKAGES[@]}"
        install_kube_lab
        echo "setup: Kubernetes lab built: $PGLAB_KUBE_LAB_IMAGES (start it with: sudo .venv/bin/python tools/kube-lab/kubelab.py up)" ;;
    test)
        install_base "test,k8s,ha" "${HA_APT_PACKAGES[@]}" "${TEST_APT_PACKAGES[@]}" "${KUBE_LAB_APT_PACKAGES[@]}"
        find_go >/dev/null || install_go  # once, before the builds that run side by side in run_tests
        run_tests ;;  # Toxiproxy, cnpg-check, ruff and mypy too, beside the tests
    *)
        echo "usage: ./setup.sh quickstart | test | install [ha|k8s|toxiproxy|cnpg-check|all …] | kube-lab" >&2
        exit 2 ;;
esac
