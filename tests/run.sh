#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs them.
# Usage: bash tests/run.sh [pytest arguments]
set -uo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

have_epc() { command -v emacs >/dev/null 2>&1 &&
  emacs --batch --eval "(require 'epc)" >/dev/null 2>&1; }

if ! have_epc; then
  echo "tests/run.sh: installing emacs-nox and elpa-epc" >&2
  as_root apt-get update -qq &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq emacs-nox elpa-epc >/dev/null ||
    { echo "tests/run.sh: could not install emacs-nox elpa-epc" >&2; exit 1; }
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]' ||
  { echo "tests/run.sh: pip install failed" >&2; exit 1; }

python3 -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "tests/run.sh: no tests ran; that is a failure" >&2
  exit 1
fi
exit "$status"
