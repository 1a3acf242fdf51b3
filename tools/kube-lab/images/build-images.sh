#!/usr/bin/env bash
# The lab's images, without a registry: root filesystems from Debian 12's packages (mmdebstrap) and the built Go
# binaries, each turned into a docker-archive tarball (mkimage.py) that the lab imports into containerd.
# usage: build-images.sh BIN WORK OUT PG_MAJOR CNPG_VERSION COREDNS_VERSION   (called by ../build.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$1" work="$2" out="$3" pg="$4" cnpg="$5" coredns="$6"
mkimage() { python3 "$here/mkimage.py" "$@" >/dev/null; }

# Debian 12 from the mirror this machine's apt uses (a Debian host), else Debian's own mirror; updates and security
# are added by mmdebstrap for a stable suite.
mirror="$(awk '/^URIs:/ && !/security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
rootfs() { # OUT.tar PACKAGES [hooks…]
    local tar="$1" pkgs="$2"; shift 2
    mmdebstrap --quiet --variant=minbase --include="$pkgs" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' "$@" \
        bookworm "$tar" ${mirror:+"$mirror"}
}

# PostgreSQL, the CloudNativePG operand: the postgres user is uid/gid 26 (CloudNativePG's default postgresUID), no
# cluster made by the package, the server binaries first on PATH. It also carries pgbench and psql, so pglab's
# client and witness Jobs use it as they use the operand image by default.
rootfs "$work/pg.tar" "postgresql-$pg,ca-certificates,tzdata" \
    --customize-hook='chroot "$1" pg_dropcluster '"$pg"' main || true' \
    --customize-hook='chroot "$1" usermod -u 26 postgres' --customize-hook='chroot "$1" groupmod -o -g 26 postgres' \
    --customize-hook='chroot "$1" sh -c "chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql"' \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Version}" postgresql-'"$pg"' > "$1/.pg-version"'
tar -xOf "$work/pg.tar" ./.pg-version > "$work/pg-version"
pg_full="$(sed -E 's/^([0-9]+\.[0-9]+).*/\1/' "$work/pg-version")"   # 15.20-0+deb12u1 -> 15.20
mkimage "$work/pg.tar" "$out/postgresql.tar" "pglab.local/postgresql:$pg" "pglab.local/postgresql:$pg_full" \
    --env "PATH=/usr/lib/postgresql/$pg/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --env LANG=C.UTF-8 --user 26 --workdir /var/lib/postgresql
rm -f "$work/pg.tar"

# The tools image of pglab's fio Jobs, disk sampler and volume probe (tools/images/Containerfile builds the same).
rootfs "$work/tools.tar" "fio"
mkimage "$work/tools.tar" "$out/tools.tar" "pglab/tools:1" "pglab.local/tools:1" \
    --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
rm -f "$work/tools.tar"

one_binary() { # OUT REF ENTRY [extra dirs]: a rootfs of one static binary
    local root="$work/root"; rm -rf "$root" && mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
    cp "$bin/$3" "$root/"
    tar --owner=0 --group=0 -C "$root" -cf "$work/one.tar" .
    mkimage "$work/one.tar" "$out/$1.tar" "$2" --entrypoint "/$3"
}
one_binary pause pglab.local/pause:1 pause
one_binary coredns "pglab.local/coredns:$coredns" coredns
# CloudNativePG's layout: the binary at /operator/manager_<arch>, /manager a link to it (the operator lists
# /operator/manager_* to know which architectures it can serve to its instances).
root="$work/root"; rm -rf "$root" && mkdir -p "$root/tmp" "$root/operator" && chmod 1777 "$root/tmp"
cp "$bin/manager" "$root/operator/manager_amd64" && ln -s operator/manager_amd64 "$root/manager"
tar --owner=0 --group=0 -C "$root" -cf "$work/one.tar" .
mkimage "$work/one.tar" "$out/cloudnative-pg.tar" "pglab.local/cloudnative-pg:$cnpg" \
    --entrypoint /manager --user 10001:10001
rm -rf "$root" "$work/one.tar"

# Manifests the lab applies, with this build's versions.
cp -r "$bin/cnpg-config" "$work/cnpg-config"
cp -r "$here/../manifests/cnpg-overlay" "$work/cnpg-overlay"
sed -i "s/CNPG_VERSION/$cnpg/" "$work/cnpg-overlay/kustomization.yaml"
sed "s/COREDNS_VERSION/$coredns/" "$here/../manifests/coredns.yaml" > "$out/coredns.yaml"
printf '{"postgresql": "pglab.local/postgresql:%s", "postgresql_full": "pglab.local/postgresql:%s", "tools": "pglab/tools:1", "pause": "pglab.local/pause:1"}\n' \
    "$pg" "$pg_full" > "$out/images.json"
