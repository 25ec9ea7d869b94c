#!/usr/bin/env bash
# Entrypoint of the SEIS images (run under tini, so SIGTERM reaches the worker and its flow runs).
#   worker [ARGS]           wait for the Prefect server at $PREFECT_API_URL, then serve whole runs: the default
#                           queue of the pool $SEIS_WORK_POOL ($SEIS_WORK_QUEUE to choose another)
#   session-worker [ARGS]   the same for sessions of dispatch=workers runs, as scripts/one-host-workers.sh starts
#                           them: the `sessions` queue, one session at a time, on the device in CUDA_VISIBLE_DEVICES
#                           (required: its GPU, or on CPU its slot); deploys seis-session/<pool without seis-> first
#   seis ARGS | evolve ARGS | gate ARGS ...   a seis command (the `seis` may be left out)
#   prefect ARGS | bash | any other program
set -euo pipefail

wait_for_server() {
    : "${PREFECT_API_URL:?set PREFECT_API_URL to the Prefect server API, e.g. http://server:4200/api}"
    python - <<'PY'
import os, sys, time, urllib.request
url = os.environ["PREFECT_API_URL"].rstrip("/") + "/health"
deadline = time.monotonic() + float(os.environ.get("SEIS_SERVER_WAIT_S", "180"))
while True:
    try:
        urllib.request.urlopen(url, timeout=5)
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"no Prefect server at {url}: {e}")
        time.sleep(2)
PY
}

start_worker() {  # ARGS of `prefect worker start`; flow runs start as child processes in /seis
    # SIGINT back to its default first: a worker that inherits it ignored (a `&` job of a script) cannot stop
    # on SIGTERM, which Prefect turns into SIGINT.
    exec python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
        prefect worker start --pool "${SEIS_WORK_POOL:?set SEIS_WORK_POOL}" --type process "$@"
}

session_worker() {
    : "${CUDA_VISIBLE_DEVICES:?set CUDA_VISIBLE_DEVICES to the one device this session worker owns, e.g. 0}"
    local pool=${SEIS_WORK_POOL:?set SEIS_WORK_POOL} deployment
    deployment=${SEIS_SESSION_DEPLOYMENT:-${pool#seis-}}   # seis-cuda -> seis-session/cuda (flows/session-deployments.yaml)
    export SEIS_WORKER_NAME=${SEIS_WORKER_NAME:-$(uname -n)-$deployment$CUDA_VISIBLE_DEVICES}
    export PREFECT_CLI_PROMPT=false
    cd "$(dirname "$0")/.."   # the checkout: the deployment runs its sessions here ({{ $PWD }})
    # The pool (kept when it exists: its settings are the operator's) and the session deployment (an update).
    prefect work-pool inspect "$pool" >/dev/null 2>&1 || prefect work-pool create "$pool" --type process >/dev/null \
        || prefect work-pool inspect "$pool" >/dev/null      # another worker created it meanwhile
    prefect deploy --prefect-file flows/session-deployments.yaml --name "$deployment"
    start_worker --work-queue sessions --limit 1 --name "$SEIS_WORKER_NAME" "$@"
}

case "${1:-}" in
    worker)
        shift
        wait_for_server
        # Only whole runs: a session taken here would have no device of its own.
        start_worker --work-queue "${SEIS_WORK_QUEUE:-default}" "$@" ;;
    session-worker)
        shift
        wait_for_server
        session_worker "$@" ;;
esac
if [ $# -eq 0 ]; then
    set -- --help
fi
if command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec seis "$@"
