#!/usr/bin/env bash
# Start or stop a 3-node tokenserver cluster on 127.0.0.1 for trying things
# by hand: `make cluster`, `make cluster-stop`. State and logs go to
# .cluster/ (CLUSTER_DIR); nodes are stopped by the PIDs recorded there:
# SIGTERM, then up to CLUSTER_STOP_GRACE seconds (default 15: a node's
# --shutdown-grace is 5s) for them to exit, then SIGKILL for any left.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${CLUSTER_DIR:-.cluster}
grace=${CLUSTER_STOP_GRACE:-15}
bin=bin/tokenserver
peers="n0=127.0.0.1:7071,n1=127.0.0.1:7081,n2=127.0.0.1:7091"

case "${1:-start}" in
start)
  mkdir -p "$dir"
  for i in 0 1 2; do
    if [ -f "$dir/n$i.pid" ] && kill -0 "$(cat "$dir/n$i.pid")" 2>/dev/null; then
      echo "n$i already runs (pid $(cat "$dir/n$i.pid"))"; continue
    fi
    "$bin" --node-id "n$i" --data-dir "$dir/n$i" \
      --grpc-addr "127.0.0.1:$((7070 + 10 * i))" --raft-addr "127.0.0.1:$((7071 + 10 * i))" --http-addr "127.0.0.1:$((7072 + 10 * i))" \
      --bootstrap-expect 3 --peers "$peers" >"$dir/n$i.log" 2>&1 &
    echo $! >"$dir/n$i.pid"
    echo "n$i: gRPC 127.0.0.1:$((7070 + 10 * i)), HTTP 127.0.0.1:$((7072 + 10 * i)), pid $!, log $dir/n$i.log"
  done
  for _ in $(seq 1 100); do
    if curl -fs 127.0.0.1:7072/readyz >/dev/null 2>&1 && curl -fs 127.0.0.1:7082/readyz >/dev/null 2>&1 && curl -fs 127.0.0.1:7092/readyz >/dev/null 2>&1; then
      echo "cluster ready: bin/tokenctl cluster status"; exit 0
    fi
    sleep 0.2
  done
  echo "cluster not ready after 20s; see $dir/*.log" >&2; exit 1
  ;;
stop)
  pids=()
  names=()
  for i in 0 1 2; do
    if [ -f "$dir/n$i.pid" ]; then
      pid=$(cat "$dir/n$i.pid")
      if kill "$pid" 2>/dev/null; then pids+=("$pid"); names+=("n$i"); fi
      rm -f "$dir/n$i.pid"
    fi
  done
  # The nodes are not our children: poll until they are gone.
  deadline=$((SECONDS + grace))
  for k in "${!pids[@]}"; do
    while kill -0 "${pids[$k]}" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "${pids[$k]}" 2>/dev/null; then
      echo "${names[$k]} (pid ${pids[$k]}) still runs ${grace}s after SIGTERM: sending SIGKILL" >&2
      kill -KILL "${pids[$k]}" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "${pids[$k]}" 2>/dev/null || break; sleep 0.1; done
    fi
    echo "stopped ${names[$k]} (pid ${pids[$k]})"
  done
  ;;
*)
  echo "usage: $0 start|stop" >&2; exit 2
  ;;
esac
