#!/usr/bin/env bash
# Builds the Prometheus server and node-exporter the lab's Prometheus tests run (tests/test_kube_lab_scale.py),
# from the Go module proxy with this folder's go.mod/go.sum, into the lab cache beside the Kubernetes binaries:
#   $PGLAB_KUBE_LAB_CACHE/prometheus-<key>/{prometheus,node_exporter}
# A separate step with its own key (this folder's files and the Go version), so a new Prometheus pin does not
# rebuild Kubernetes, and build.sh's key does not change with it. Prometheus v0.316.0 needs Go >= 1.26.7, newer
# than the lab's toolchain: the pinned toolchain below comes from the module proxy, checksum-verified.
# usage: tools/kube-lab/prometheus/build.sh GO   (GO: any go >= 1.19). Prints the folder on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bootstrap_go="${1:?usage: build.sh GO}"
cache="${PGLAB_KUBE_LAB_CACHE:-${XDG_CACHE_HOME:-${HOME:?}/.cache}/pglab/kube-lab}"
GO_TOOLCHAIN=go1.26.8
PROMETHEUS_VERSION=3.16.0  # module version v0.316.0 (Prometheus 3.x modules are tagged v0.3MM.P)
NODE_EXPORTER_VERSION=1.12.1

gorun() {
    env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/cache" GOTMPDIR="$cache/go/tmp" \
        GOFLAGS="-p=2 -buildvcs=false -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0 \
        "$go" "$@"
}

mkdir -p "$cache/go/tmp"
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
toolchain="$(env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
    "$bootstrap_go" mod download -json "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -x "$toolchain/bin/go" ] || chmod -R u+x "$toolchain/bin" "$toolchain/pkg/tool"
go="$toolchain/bin/go"
key="$( (cd "$here" && find . -type f | LC_ALL=C sort | xargs sha256sum; gorun env GOVERSION) | sha256sum | cut -c1-16)"
out="$cache/prometheus-$key"
if [ ! -f "$out/.complete" ]; then
    echo "kube-lab: building Prometheus $PROMETHEUS_VERSION and node-exporter $NODE_EXPORTER_VERSION with" \
        "$(gorun env GOVERSION) (from nothing ~15 min on 2 cores)" >&2
    rm -rf "$out" && mkdir -p "$out"
    t0=$SECONDS
    ver=github.com/prometheus/common/version
    (cd "$here" && gorun build -trimpath -ldflags "-s -w -X $ver.Version=$PROMETHEUS_VERSION" \
        -o "$out/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
    (cd "$here" && gorun build -trimpath -ldflags "-s -w -X $ver.Version=$NODE_EXPORTER_VERSION" \
        -o "$out/node_exporter" github.com/prometheus/node_exporter)
    echo "kube-lab: Prometheus built in $((SECONDS - t0)) s" >&2
    touch "$out/.complete"
fi
echo "$out"
