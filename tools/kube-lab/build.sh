#!/usr/bin/env bash
# Builds the Kubernetes lab the tests run on: binaries from the Go module proxy (go.sum verified) and container
# images from Debian's packages, no registry. Everything goes to the lab cache, outside the checkout:
#   $PGLAB_KUBE_LAB_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/pglab/kube-lab)
#     go/                 Go module and build caches (a rebuild after a version bump reuses what did not change)
#     bin-<key>/          kube-apiserver … kubectl, etcd, pause, manager (CloudNativePG), coredns
#       provisioner-<pkey>/hostpath-provisioner   the lab's volume provisioner, keyed by its own source (and go.sum)
#                         alone: an edit of it builds only it (seconds), not Kubernetes (kubelab.py computes <pkey>)
#     images-<key>/       docker-archive tarballs for `ctr images import`, and the operator's manifests
# <key> digests the inputs (this folder's files and the Go version), so a second run with the same inputs builds
# nothing, and a changed pin builds again beside the old one.
# usage: tools/kube-lab/build.sh GO     (GO: any go >= 1.19; it fetches the pinned toolchain below from the module
#                                        proxy, checksum-verified, and builds with that one)
# Prints the images folder (the lab's whole input) on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bootstrap_go="${1:?usage: build.sh GO}"
cache="${PGLAB_KUBE_LAB_CACHE:-${XDG_CACHE_HOME:-${HOME:?}/.cache}/pglab/kube-lab}"
GO_TOOLCHAIN=go1.25.5

KUBERNETES_VERSION=1.34.10
CNPG_VERSION=1.28.2
COREDNS_VERSION=1.12.4
PG_MAJOR=15

gorun() {
    env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/cache" GOTMPDIR="$cache/go/tmp" \
        GOFLAGS="-p=2 -buildvcs=false -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0 \
        "$go" "$@"
}
digest() { (cd "$here" && find "$@" -type f | LC_ALL=C sort | xargs sha256sum; echo "$(gorun env GOVERSION)") | sha256sum | cut -c1-16; }

mkdir -p "$cache/go/tmp"
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
toolchain="$(env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
    "$bootstrap_go" mod download -json "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -x "$toolchain/bin/go" ] || chmod -R u+x "$toolchain/bin" "$toolchain/pkg/tool"
go="$toolchain/bin/go"
# The provisioner is not in the binaries' key (its edits would rebuild Kubernetes): it has a key of its own below.
bin_key="$(digest k8s/go.mod k8s/go.sum k8s/tools.go k8s/cmd/etcd k8s/cmd/pause cnpg coredns build.sh)"
bin="$cache/bin-$bin_key"
if [ ! -f "$bin/.complete" ]; then
    echo "kube-lab: building Kubernetes v$KUBERNETES_VERSION, etcd, CloudNativePG $CNPG_VERSION and CoreDNS $COREDNS_VERSION" \
        "with $(gorun env GOVERSION) (from nothing ~30 min on 2 cores; with the Go build cache ~2 min)" >&2
    rm -rf "$bin" && mkdir -p "$bin"
    t0=$SECONDS
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=${KUBERNETES_VERSION%%.*}"
        ld="$ld -X $p.gitMinor=$(echo $KUBERNETES_VERSION | cut -d. -f2) -X $p.gitTreeState=clean"
    done
    # One go build for every binary of the Kubernetes module graph: they share most packages.
    (cd "$here/k8s" && gorun build -trimpath -ldflags "$ld" -o "$bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
        k8s.io/kubernetes/cmd/kubectl ./cmd/etcd ./cmd/pause)
    (cd "$here/cnpg" && gorun build -trimpath -ldflags "-s -w" -o "$bin/manager" \
        github.com/cloudnative-pg/cloudnative-pg/cmd/manager)
    (cd "$here/coredns" && gorun build -trimpath -ldflags "-s -w" -o "$bin/coredns" .)
    # The operator's own manifests (CRDs, RBAC, Deployment) come from the module's config/ folder.
    cnpg_dir="$(cd "$here/cnpg" && gorun list -m -f '{{.Dir}}' github.com/cloudnative-pg/cloudnative-pg)"
    cp -r "$cnpg_dir/config" "$bin/cnpg-config" && chmod -R u+w "$bin/cnpg-config"
    echo "kube-lab: binaries built in $((SECONDS - t0)) s" >&2
    touch "$bin/.complete"
fi

# The provisioner's key: its files and the module's go.mod/go.sum, in the form kubelab.py's provisioner_key() computes.
prov_key="$(cd "$here" && find k8s/cmd/hostpath-provisioner k8s/go.mod k8s/go.sum -type f | LC_ALL=C sort |
    xargs sha256sum | sha256sum | cut -c1-16)"
prov="$bin/provisioner-$prov_key"
if [ ! -x "$prov/hostpath-provisioner" ]; then
    rm -rf "$prov" && mkdir -p "$prov"
    (cd "$here/k8s" && gorun build -trimpath -ldflags "-s -w" -o "$prov/" ./cmd/hostpath-provisioner)
fi
# where an older checkout's kubelab.py looks for it
ln -sfn "provisioner-$prov_key/hostpath-provisioner" "$bin/hostpath-provisioner"

images_key="$(digest images manifests build.sh | cut -c1-8)$bin_key"
images="$cache/images-$images_key"
if [ ! -f "$images/.complete" ]; then
    rm -rf "$images" && mkdir -p "$images"
    t0=$SECONDS
    work="$(mktemp -d "$cache/work.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    echo "kube-lab: building the lab's images from Debian's packages (~5 min)" >&2
    "$here/images/build-images.sh" "$bin" "$work" "$images" "$PG_MAJOR" "$CNPG_VERSION" "$COREDNS_VERSION"
    "$bin/kubectl" kustomize --load-restrictor LoadRestrictionsNone "$work/cnpg-overlay" > "$images/cnpg-operator.yaml"
    echo "kube-lab: images built in $((SECONDS - t0)) s" >&2
    touch "$images/.complete"
fi
echo "$images"
