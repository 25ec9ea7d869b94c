#!/usr/bin/env bash
# One machine as a SEIS work pool (README, "Scale-out: sessions on GPU workers"): a Prefect server unless
# PREFECT_API_URL names one, the pool and the `seis-session` deployment, and one worker per device, each owning it.
# Workers on one host share the run's snapshot store (file-locked), so no DVC remote is needed here.
#
#   scripts/one-host-workers.sh up [--gpus 0,1] [--cpu N] [--state DIR]   # then: export PREFECT_API_URL=... (printed)
#   seis evolve --dispatch workers ...                                       # --session-deployment seis-session/cpu with --cpu
#   scripts/one-host-workers.sh down [--state DIR]
#
# --gpus: the CUDA devices, one worker each (default: every GPU nvidia-smi lists). --cpu N: N CPU workers on the
# seis-cpu pool instead (tests, machines without a GPU). Logs and pids go to the state folder (default
# .cache/workers), and `down` stops every process `up` started.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}; shift || true
gpus="" cpu=0 state=.cache/workers
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) gpus=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$state"; state=$(cd "$state" && pwd)
export PREFECT_HOME=${PREFECT_HOME:-$state/prefect-home} DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false \
  PREFECT_CLI_PROMPT=false PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-2}
prefect_cli() { python3 -m prefect "$@"; }

start() {  # name, command...: in its own session, so that `down` ends it with everything it started
  local name=$1; shift
  setsid "$@" > "$state/$name.log" 2>&1 < /dev/null &
  echo $! > "$state/$name.pid"
}

down() {
  for pidfile in "$state"/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  rm -f "$state/api"
  echo "stopped everything started from $state"
}

wait_for() {  # what, seconds, python condition over the API at $PREFECT_API_URL
  local what=$1 seconds=$2 check=$3
  for _ in $(seq "$seconds"); do
    python3 -c "$check" 2>/dev/null && return 0
    sleep 1
  done
  echo "error: $what did not come up in $seconds s; logs in $state" >&2
  down >&2
  exit 1
}

up() {
  if [ "$cpu" -gt 0 ]; then
    pool=seis-cpu deployment=cpu devices=$(seq -s, 0 $((cpu - 1)))
  else
    pool=seis-cuda deployment=cuda
    devices=${gpus:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | paste -sd, -)}
    [ -n "$devices" ] || { echo "error: no GPU found (nvidia-smi); give --gpus, or --cpu N for CPU workers" >&2; exit 2; }
  fi
  if [ -z "${PREFECT_API_URL:-}" ]; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    export PREFECT_API_URL=http://127.0.0.1:$port/api
    start server python3 -m prefect server start --host 127.0.0.1 --port "$port"
    wait_for "the Prefect server" 120 \
      "import urllib.request as u; u.urlopen('$PREFECT_API_URL/health', timeout=2)"
  fi
  echo "$PREFECT_API_URL" > "$state/api"
  prefect_cli work-pool create "$pool" --type process --overwrite > "$state/pool.log" 2>&1
  prefect_cli deploy --prefect-file flows/session-deployments.yaml --name "$deployment" > "$state/deploy.log" 2>&1 \
    || { cat "$state/deploy.log" >&2; down >&2; exit 1; }
  names=()
  for device in ${devices//,/ }; do
    name=$(uname -n)-$deployment$device
    names+=("$name")
    # the device a worker owns (on CPU only its slot: the gates of two CPU workers do not share a lock)
    start "worker-$device" env CUDA_VISIBLE_DEVICES="$device" SEIS_WORKER_NAME="$name" \
      python3 -m prefect worker start --pool "$pool" --work-queue sessions --limit 1 --name "$name" --type process
  done
  wait_for "the workers ${names[*]}" 120 "
from prefect import get_client
with get_client(sync_client=True) as c:
    online = {w.name for w in c.read_workers_for_work_pool('$pool') if w.status == 'ONLINE'}
assert set('${names[*]}'.split()) <= online"
  echo "workers ${names[*]} on pool $pool, deployment seis-session/$deployment; state in $state"
  echo "export PREFECT_API_URL=$PREFECT_API_URL"
}

case $cmd in
  up) up ;;
  down) down ;;
  *) echo "usage: scripts/one-host-workers.sh up [--gpus 0,1] [--cpu N] [--state DIR] | down [--state DIR]" >&2
     exit 2 ;;
esac
