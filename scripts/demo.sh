#!/usr/bin/env bash
# `make demo`: until the EAGLE-3 example plan lands, show the example plan's status.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/runbook validate plans/example.md
.venv/bin/runbook status --plan plans/example.md
