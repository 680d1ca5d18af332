#!/usr/bin/env bash
# Build the JupyterLab extension into ../dpmagic/labextension, the copy shipped
# in the wheel. PYTHON is the environment whose JupyterLab the build targets
# (its staging package.json pins the shared packages); default: ../.venv.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-../.venv/bin/python}"
core="$("$PYTHON" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')"
npm ci --silent --no-audit --no-fund
npx tsc
rm -rf ../dpmagic/labextension
node node_modules/@jupyterlab/builder/lib/build-labextension.js --core-path "$core" .
