#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh machine, then runs pytest.
# - opencortex with its test extras, editable, in the project's virtual environment
#   <checkout>/.venv (kernel/install.sh: quick and silent when already done);
# - emacs-nox, elpa-epc and elpa-package-lint (apt-get, after apt-get update) when Emacs
#   cannot load epc and package-lint.
# pytest runs from .venv (which comes first on PATH); "no tests ran" is a failure.
# Usage: bash tests/run.sh [pytest arguments]
set -uo pipefail
cd "$(dirname "$0")/.."

bash kernel/install.sh test || { echo "tests/run.sh: kernel/install.sh test failed" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

EMACS_PACKAGES="emacs-nox elpa-epc elpa-package-lint"
have_emacs_packages() { command -v emacs >/dev/null 2>&1 &&
  emacs --batch --eval "(progn (require 'epc) (require 'package-lint))" >/dev/null 2>&1; }

if ! have_emacs_packages; then
  echo "tests/run.sh: installing $EMACS_PACKAGES" >&2
  as_root apt-get update -qq &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $EMACS_PACKAGES >/dev/null ||
    { echo "tests/run.sh: could not install $EMACS_PACKAGES" >&2; exit 1; }
fi

export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "tests/run.sh: no tests ran; that is a failure" >&2
  exit 1
fi
exit "$status"
