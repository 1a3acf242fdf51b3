#!/usr/bin/env bash
# The two TLS secrets the Barman Cloud plugin and the CloudNativePG operator use for their gRPC mTLS, made with
# openssl instead of cert-manager (the plugin's release manifest asks cert-manager for the same two self-signed
# certificates: barman-cloud-server, barman-cloud-client; Issuer selfSigned, 2160 h).
#   barman-cloud-server-tls  server cert, CN and DNS SAN "barman-cloud" (the plugin Service's name: the operator
#                            dials <service>:<cnpg.io/pluginPort> and checks the server name against the Service name
#                            unless the Service has cnpg.io/pluginServerName); the operator trusts its tls.crt as the
#                            only root (internal/controller/plugin_controller.go), the plugin serves it with
#                            --server-cert/--server-key.
#   barman-cloud-client-tls  client cert, CN barman-cloud-client; the operator presents tls.crt/tls.key, the plugin
#                            trusts tls.crt as its client CA (--client-cert).
# The Service named by the operator's lookup carries the annotations cnpg.io/pluginServerSecret and
# cnpg.io/pluginClientSecret naming these secrets, the label cnpg.io/pluginName=barman-cloud.cloudnative-pg.io, and
# lives in the operator's namespace.
# usage: plugin-certs.sh NAMESPACE [DAYS]   prints the two Secret manifests (YAML) on stdout
set -euo pipefail
ns="${1:?usage: plugin-certs.sh NAMESPACE [DAYS]}"
days="${2:-3650}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cert() { # NAME CN USAGE [SAN]
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
        -subj "/CN=$2" -keyout "$work/$1.key" -out "$work/$1.crt" \
        -addext "basicConstraints=critical,CA:FALSE" -addext "keyUsage=critical,digitalSignature,keyEncipherment" \
        -addext "extendedKeyUsage=$3" ${4:+-addext "subjectAltName=$4"} 2>/dev/null
}
secret() { # NAME
    printf -- '---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata:\n  name: %s\n  namespace: %s\n' "$1" "$ns"
    printf 'data:\n  tls.crt: %s\n  tls.key: %s\n' "$(base64 -w0 < "$work/$1.crt")" "$(base64 -w0 < "$work/$1.key")"
}
cert barman-cloud-server-tls barman-cloud serverAuth "DNS:barman-cloud,DNS:barman-cloud.$ns,DNS:barman-cloud.$ns.svc"
cert barman-cloud-client-tls barman-cloud-client clientAuth
secret barman-cloud-server-tls
secret barman-cloud-client-tls
