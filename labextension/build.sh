#!/usr/bin/env bash
# Build the JupyterLab extension into ../dpmagic/labextension, the copy shipped
# in the wheel. PYTHON is the environment whose JupyterLab the build targets
# (its staging package.json pins the shared packages); default: ../.venv.
#
# The build runs in a fixed folder under the temporary directory: JupyterLab's
# builder hashes the absolute path of the extension into a module id, so
# building in place would give each checkout a different remoteEntry file and
# the committed build could not be compared with a rebuild (.ci/run does). The
# committed build was made with TMPDIR unset, as CI runs it; a rebuild under
# another TMPDIR differs in that id alone.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-../.venv/bin/python}"
core="$("$PYTHON" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')"
stage="${TMPDIR:-/tmp}/dpmagic-labextension-build"
rm -rf "$stage"
mkdir -p "$stage/labextension"
cp -r package.json package-lock.json tsconfig.json src "$stage/labextension/"
(
  cd "$stage/labextension"
  npm ci --silent --no-audit --no-fund
  npx tsc
  node node_modules/@jupyterlab/builder/lib/build-labextension.js --core-path "$core" .
)
rm -rf ../dpmagic/labextension
cp -r "$stage/dpmagic/labextension" ../dpmagic/labextension
rm -rf "$stage"
