#!/usr/bin/env bash
# End-to-end figures over loopback, server on core 0 and load generator on
# core 1 (taskset): a bare gRPC unary call (tokenctl bench-server, gRPC's
# health service) against AcquireToken with 64 concurrent callers, and
# AcquireTokens with 100 items per call. Part of `make bench`.
# BENCH_TLS=1 measures the same over TLS (certificates from tokenctl certs):
# bench-server and tokenserver serve TLS, and tokenserver runs once more
# with token auth too (the client sends a bearer token on every call).
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${BENCH_DURATION:-10s}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
pin0="taskset -c 0"; pin1="taskset -c 1"
if ! command -v taskset >/dev/null || [ "$(nproc)" -lt 2 ]; then pin0=""; pin1=""; echo "(no taskset or one core: not pinned)"; fi

$pin0 bin/tokenctl bench-server --addr 127.0.0.1:7199 >"$work/bare.addr" 2>"$work/bare.log" &
pids+=($!)
$pin0 bin/tokenserver --data-dir "$work/data" --grpc-addr 127.0.0.1:7190 --http-addr 127.0.0.1:7192 --raft-addr 127.0.0.1:7191 --log-level warn 2>"$work/server.log" &
pids+=($!)
for _ in $(seq 1 100); do curl -fs 127.0.0.1:7192/readyz >/dev/null 2>&1 && break; sleep 0.1; done
bin/tokenctl --server 127.0.0.1:7190 rule put bench --algorithm token-bucket --limit 1000000000 --period 1s -o json >/dev/null

echo "lscpu threads per core: $(lscpu | awk -F: '/Thread\(s\) per core/ {gsub(/ /,"",$2); print $2}')"
for mode in bare unary batch; do
  server=127.0.0.1:7190; extra=(--rule bench)
  [ "$mode" = bare ] && { server=127.0.0.1:7199; extra=(); }
  $pin1 bin/tokenctl --server "$server" bench --mode "$mode" "${extra[@]}" --concurrency 64 --keys 10000 --batch 100 --duration "$dur" -o json 2>/dev/null
done

if [ "${BENCH_TLS:-0}" = 1 ]; then
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  pki="$work/pki"
  bin/tokenctl certs --out-dir "$pki" create-ca >/dev/null
  bin/tokenctl certs --out-dir "$pki" create-node n0 --ip 127.0.0.1 --dns localhost >/dev/null
  admin_json=$(bin/tokenctl token create ops admin -o json)
  admin=$(printf '%s' "$admin_json" | tr -d '\n' | sed -E 's/.*"token": *"([^"]+)".*/\1/')
  client_json=$(bin/tokenctl token create bench client,viewer -o json)
  tok=$(printf '%s' "$client_json" | tr -d '\n' | sed -E 's/.*"token": *"([^"]+)".*/\1/')
  { printf '%s' "$admin_json" | tr -d '\n' | sed -E 's/.*"line": *"([^"]+)".*/\1/'; echo; printf '%s' "$client_json" | tr -d '\n' | sed -E 's/.*"line": *"([^"]+)".*/\1/'; echo; } >"$pki/tokens"
  tlsflags=(--tls-cert "$pki/n0.crt" --tls-key "$pki/n0.key")
  $pin0 bin/tokenctl bench-server --addr 127.0.0.1:7199 --serve-cert "$pki/n0.crt" --serve-key "$pki/n0.key" >"$work/bare-tls.addr" 2>"$work/bare-tls.log" &
  pids+=($!)
  for auth in off on; do
    extra_srv=(); cli=(--tls-ca "$pki/ca.crt")
    [ "$auth" = on ] && { extra_srv=(--auth-tokens "$pki/tokens"); }
    rm -rf "$work/data-tls"
    $pin0 bin/tokenserver --data-dir "$work/data-tls" --grpc-addr 127.0.0.1:7190 --http-addr 127.0.0.1:7192 --raft-addr 127.0.0.1:7191 --log-level warn "${tlsflags[@]}" "${extra_srv[@]}" 2>"$work/server-tls-$auth.log" &
    spid=$!; pids+=($spid)
    for _ in $(seq 1 100); do curl -kfs https://127.0.0.1:7192/readyz >/dev/null 2>&1 && break; sleep 0.1; done
    bin/tokenctl --server 127.0.0.1:7190 "${cli[@]}" --token "$admin" rule put bench --algorithm token-bucket --limit 1000000000 --period 1s -o json >/dev/null
    modes="unary batch"; [ "$auth" = off ] && modes="bare unary batch"
    for mode in $modes; do
      server=127.0.0.1:7190; extra=(--rule bench); c=("${cli[@]}")
      [ "$auth" = on ] && c+=(--token "$tok")
      [ "$mode" = bare ] && { server=127.0.0.1:7199; extra=(); c=(--tls-ca "$pki/ca.crt"); }
      echo "tls=on auth=$auth mode=$mode"
      $pin1 bin/tokenctl --server "$server" "${c[@]}" bench --mode "$mode" "${extra[@]}" --concurrency 64 --keys 10000 --batch 100 --duration "$dur" -o json 2>/dev/null
    done
    kill "$spid"; wait "$spid" 2>/dev/null || true
  done
fi
