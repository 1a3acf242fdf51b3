#!/usr/bin/env bash
# Builds what the lab needs to archive WAL and take base backups to an object store (issue 28 item 1), from the Go
# module proxy with this folder's go.mod/go.sum files and from Debian's packages, into the lab cache beside the
# Kubernetes binaries:
#   $PGLAB_KUBE_LAB_CACHE/objectstore-<key>/
#     versitygw                      the S3-compatible server: versitygw (github.com/versity/versitygw, Apache-2.0),
#                                    an S3 gateway whose posix backend keeps objects as files
#     manager                        CloudNativePG's Barman Cloud plugin: one binary, `manager operator` (the
#                                    Deployment beside the operator), `manager instance` (the sidecar in each
#                                    instance pod), `manager restore` (the sidecar of a recovery Job),
#                                    `manager healthcheck unix` (the sidecar's startup probe)
#     images/*.tar                   docker-archive tarballs for `ctr images import`, as the lab's own images:
#                                    pglab.local/versitygw:<v>, pglab.local/plugin-barman-cloud:<v> (the operator part),
#                                    pglab.local/plugin-barman-cloud-sidecar:<v> (Debian 12's barman-cli-cloud, python3,
#                                    boto3, and the manager at /manager, user 26)
#     barman-cloud-plugin.yaml       the plugin's CRD (ObjectStore), RBAC, Service and Deployment for cnpg-system, from
#                                    the module's own kubernetes/ and config/ folders with the lab's images (no
#                                    cert-manager: plugin-certs.sh makes the two TLS secrets it mounts)
#     versitygw.yaml                 the object store's namespace, credentials Secret, Deployment and Service
# <key> digests this folder's files and the Go version: a second run with the same inputs builds nothing.
# usage: tools/kube-lab/objectstore/build.sh GO   (GO: any go >= 1.19). Prints the folder on its last line.
# Called by ./setup.sh kube-lab; `kubelab.py objectstore` starts what it built in a running lab.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bootstrap_go="${1:?usage: build.sh GO}"
cache="${PGLAB_KUBE_LAB_CACHE:-${XDG_CACHE_HOME:-${HOME:?}/.cache}/pglab/kube-lab}"
GO_TOOLCHAIN=go1.26.8          # the plugin's go.mod says go 1.26.4
PLUGIN_VERSION=0.15.0
VERSITYGW_VERSION=1.8.0        # versitygw/go.mod
jobs="${OBJECTSTORE_BUILD_JOBS:-1}"   # go build -p and GOMAXPROCS: 1 keeps a shared 2-core machine usable

gorun() {
    env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/cache" GOTMPDIR="$cache/go/tmp" \
        GOFLAGS="-p=$jobs -buildvcs=false -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0 GOMAXPROCS="$jobs" \
        nice -n 19 "$go" "$@"
}

mkdir -p "$cache/go/tmp"
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; *) arch="$(uname -m)" ;; esac
toolchain="$(env GOPATH="$cache/go" GOMODCACHE="$cache/go/mod" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
    "$bootstrap_go" mod download -json "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -x "$toolchain/bin/go" ] || chmod -R u+x "$toolchain/bin" "$toolchain/pkg/tool"
go="$toolchain/bin/go"
# The key: the build's inputs only (not the README, the example or plugin-certs.sh, which the lab runs at start).
key="$( (cd "$here" && find . -type f ! -name '*.md' ! -name example.yaml ! -name plugin-certs.sh | LC_ALL=C sort |
    xargs sha256sum; gorun env GOVERSION) | sha256sum | cut -c1-16)"
out="$cache/objectstore-$key"
if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
fi

echo "kube-lab: building versitygw v$VERSITYGW_VERSION and the Barman Cloud plugin v$PLUGIN_VERSION with" \
    "$(gorun env GOVERSION) (from nothing ~10 min on 2 cores; with the Go build cache ~1 min), then their images" >&2
rm -rf "$out" && mkdir -p "$out/images"
work="$(mktemp -d "$cache/work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
(cd "$here/versitygw" && gorun build -trimpath \
    -ldflags "-s -w -X main.Version=v$VERSITYGW_VERSION" -o "$out/versitygw" github.com/versity/versitygw/cmd/versitygw)
(cd "$here/barman-cloud" && gorun build -trimpath -ldflags "-s -w" -o "$out/manager" \
    github.com/cloudnative-pg/plugin-barman-cloud/cmd/manager)
echo "kube-lab: object store binaries built in $((SECONDS - t0)) s" >&2

# The plugin's own manifests: kubernetes/ (Deployment, Service, cert-manager Certificates) and config/ (CRD, RBAC).
t1=$SECONDS
plugin_dir="$(cd "$here/barman-cloud" && gorun list -m -f '{{.Dir}}' github.com/cloudnative-pg/plugin-barman-cloud)"
mkdir -p "$work/plugin"
cp -r "$plugin_dir/kubernetes" "$plugin_dir/config" "$work/plugin/" && chmod -R u+w "$work/plugin"
cp -r "$here/plugin-overlay" "$work/plugin/overlay"
sed -i "s/PLUGIN_VERSION/$PLUGIN_VERSION/g" "$work/plugin/overlay/kustomization.yaml"
# The lab's own kubectl (build.sh's), else any on PATH.
kubectl="$(find "$cache" -maxdepth 2 -path "$cache/bin-*/kubectl" -printf '%T@ %p\n' | sort -rn | head -1 | cut -d' ' -f2-)"
kubectl="${kubectl:-$(command -v kubectl || true)}"
[ -n "$kubectl" ] || { echo "kube-lab: no kubectl to render the plugin's manifests: run tools/kube-lab/build.sh first" >&2; exit 1; }
"$kubectl" kustomize --load-restrictor LoadRestrictionsNone "$work/plugin/overlay" > "$out/barman-cloud-plugin.yaml"
sed "s/VERSITYGW_TAG/$VERSITYGW_VERSION/g" "$here/versitygw.yaml" > "$out/versitygw.yaml"

# Images, made as tools/kube-lab/images/build-images.sh makes the lab's.
mkimage() { python3 "$here/../images/mkimage.py" "$@" >/dev/null; }
one_binary() { # OUT REF ENTRY USER
    local root="$work/root"; rm -rf "$root" && mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
    cp "$out/$3" "$root/"
    tar --owner=0 --group=0 -C "$root" -cf "$work/one.tar" .
    mkimage "$work/one.tar" "$out/images/$1.tar" "$2" --entrypoint "/$3" --user "$4"
    rm -f "$work/one.tar"
}
one_binary versitygw "pglab.local/versitygw:$VERSITYGW_VERSION" versitygw 1000:1000
one_binary plugin-barman-cloud "pglab.local/plugin-barman-cloud:$PLUGIN_VERSION" manager 10001:10001
# The sidecar: the plugin's upstream image is distroless Python 3 with a venv of barman[cloud] 3.20 from PyPI;
# here Debian 12's barman-cli-cloud (barman 3.4.0, boto3 1.26) and python3 from the lab's Debian mirror.
mirror="$(awk '/^URIs:/ && !/security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
mmdebstrap --quiet --variant=minbase --include="barman-cli-cloud,ca-certificates,tzdata" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    --customize-hook="cp '$out/manager' \"\$1/manager\"" \
    --customize-hook='chroot "$1" groupadd -o -g 26 postgres' \
    --customize-hook='chroot "$1" useradd -u 26 -g 26 -M -d /var/lib/postgresql postgres' \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Version}" barman-cli-cloud > "$1/.barman-version"' \
    bookworm "$work/sidecar.tar" ${mirror:+"$mirror"}
printf 'versitygw v%s\nplugin-barman-cloud %s\nbarman-cli-cloud %s\n' "$VERSITYGW_VERSION" "$PLUGIN_VERSION" \
    "$(tar -xOf "$work/sidecar.tar" ./.barman-version)" > "$out/versions.txt"
mkimage "$work/sidecar.tar" "$out/images/plugin-barman-cloud-sidecar.tar" \
    "pglab.local/plugin-barman-cloud-sidecar:$PLUGIN_VERSION" \
    --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" --env LANG=C.UTF-8 \
    --entrypoint /manager --user 26:26
rm -f "$work/sidecar.tar"
echo "kube-lab: object store manifests and images made in $((SECONDS - t1)) s" >&2
touch "$out/.complete"
echo "$out"
