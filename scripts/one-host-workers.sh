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

prefect_cli() { python3 -m prefect "$@"; }

start() {  # name, command...: in its own session, so that `down` ends it with everything it started
  local name=$1; shift
  # SIGINT back to its default: a `&` job of a script inherits it ignored, and a Prefect worker turns SIGTERM into
  # SIGINT, so it would ignore SIGTERM too (and be SIGKILLed by `down`, its session in flight with it)
  setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
    "$@" > "$state/$name.log" 2>&1 < /dev/null &
  echo $! > "$state/$name.pid"
}

processes() {  # every live process as "pid ppid pgid" (from /proc: no procps needed; zombies run nothing)
  local stat line fields pid
  for stat in /proc/[0-9]*/stat; do
    { read -r line < "$stat"; } 2>/dev/null || continue
    read -ra fields <<< "${line##*) }"      # after the command name: state, ppid, pgid, ...
    [ "${fields[0]}" = Z ] && continue
    pid=${stat#/proc/}
    echo "${pid%/stat} ${fields[1]} ${fields[2]}"
  done
}

flow_runs() {  # worker pid: its flow-run processes (`python -m prefect.engine`; not its hook runners)
  local pid ppid pgid argv
  while read -r pid ppid pgid; do
    [ "$ppid" = "$1" ] || continue
    argv=$({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null) || continue
    if [[ $argv == *"-m prefect.engine"* ]]; then echo "$pid"; fi
  done < <(processes)
  return 0
}

running() {  # pid, group (yes|no): whether it (or a process of its group) still runs
  local pid ppid pgid
  while read -r pid ppid pgid; do
    if [ "$pid" = "$1" ] || { [ "$2" = yes ] && [ "$pgid" = "$1" ]; }; then return 0; fi
  done < <(processes)
  return 1
}

stop() {  # pid, grace seconds: SIGTERM to its process group (or the process alone), SIGKILL what is left then
  local pid=$1 grace=$2 group=yes target=-$1
  kill -0 -- "$target" 2>/dev/null || { group=no target=$pid; }
  kill -TERM -- "$target" 2>/dev/null || return 0
  for _ in $(seq $((grace * 5))); do running "$pid" "$group" || return 0; sleep 0.2; done
  echo "$pid did not stop within $grace s of SIGTERM: killed" >&2
  kill -KILL -- "$target" 2>/dev/null || true
}

down() {
  # 1. each worker's flow runs (sessions in flight, in process groups of their own): SIGTERM kills a session's
  #    engines, releases its GPU slot and marks its flow run Crashed while the server still answers; its run stops
  #    naming it, and --resume redoes it
  local pidfile child
  for pidfile in "$state"/worker-*.pid; do
    [ -e "$pidfile" ] || continue
    for child in $(flow_runs "$(cat "$pidfile")"); do stop "$child" 60 & done
  done
  wait
  # 2. the workers, which stop at once on SIGTERM; 3. the server last
  for pidfile in "$state"/worker-*.pid; do
    [ -e "$pidfile" ] || continue
    stop "$(cat "$pidfile")" 10 &
  done
  wait
  rm -f "$state"/worker-*.pid
  if [ -e "$state/server.pid" ]; then stop "$(cat "$state/server.pid")" 10; rm -f "$state/server.pid"; fi
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

main() {
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
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  mkdir -p "$state"; state=$(cd "$state" && pwd)
  export PREFECT_HOME=${PREFECT_HOME:-$state/prefect-home} DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_CLI_PROMPT=false PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-2}
  case $cmd in
    up) up ;;
    down) down ;;
    *) echo "usage: scripts/one-host-workers.sh up [--gpus 0,1] [--cpu N] [--state DIR] | down [--state DIR]" >&2
       exit 2 ;;
  esac
}

# sourced (tests), it only defines the functions above
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
