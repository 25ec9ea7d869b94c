#!/usr/bin/env bash
# Entrypoint of the SEIS images (run under tini, so SIGTERM reaches the worker and its flow runs).
#   worker [ARGS]   wait for the Prefect server at $PREFECT_API_URL, then serve the pool $SEIS_WORK_POOL
#   seis ARGS | evolve ARGS | gate ARGS ...   a seis command (the `seis` may be left out)
#   prefect ARGS | bash | any other program
set -euo pipefail
if [ "${1:-}" = worker ]; then
    shift
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
    # The pool is created (type process) when missing; flow runs start as child processes in /seis.
    # SIGINT back to its default first: a worker that inherits it ignored (a `&` job of a script) cannot stop
    # on SIGTERM, which Prefect turns into SIGINT.
    exec python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
        prefect worker start --pool "${SEIS_WORK_POOL:?set SEIS_WORK_POOL}" --type process "$@"
fi
if [ $# -eq 0 ]; then
    set -- --help
fi
if command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec seis "$@"
