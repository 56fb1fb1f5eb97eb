#!/usr/bin/env bash
# Install opencortex from this checkout into the project's virtual environment,
# <checkout>/.venv, editable (edits to kernel/, skills/, org/ and elisp/ count at once);
# the program is then <checkout>/.venv/bin/opencortex.  Quick and silent when that is
# already done: it reinstalls only when pyproject.toml changed, the checkout moved, an
# extra is asked for that is not installed yet, or .venv does not work.
#
# Usage: bash kernel/install.sh [EXTRA...]
#   EXTRA: an optional part from pyproject.toml's [project.optional-dependencies]
#   (test, telegram, ...); extras installed once stay installed.
#
# Python: $PYTHON, else python3; 3.11 or newer.  On Debian and Ubuntu, when there is no
# python3 or it cannot make a virtual environment (ensurepip missing), it installs the
# python3 and pythonX.Y-venv packages with apt-get (as root, else through sudo); where
# that is not possible it says what to run.  To start over: rm -rf .venv
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
VENV="$ROOT/.venv"
STAMP="$VENV/.opencortex-install"
PYTHON=${PYTHON:-python3}

say() { echo "kernel/install.sh: $*" >&2; }
die() { say "$*"; exit 1; }

for extra in "$@"; do
  [[ $extra =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "not an extra name: '$extra'"
done

# What an install depends on: pyproject.toml (dependencies, entry points) and where the
# checkout is (an editable install and the venv's scripts name it).
key="$(sha256sum pyproject.toml | cut -d' ' -f1) $ROOT"

# 0 when the stamp says this key is installed with every extra in "$@".
installed() {
  [ -f "$STAMP" ] || return 1
  local stamp_key stamp_extras extra
  { IFS= read -r stamp_key && IFS= read -r stamp_extras; } <"$STAMP" || return 1
  [ "$stamp_key" = "$key" ] || return 1
  for extra in "$@"; do
    [[ " $stamp_extras " == *" $extra "* ]] || return 1
  done
}

# 0 when .venv has a Python 3.11+ with pip.
venv_works() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c 'import sys, pip; sys.exit(sys.version_info < (3, 11))' \
      >/dev/null 2>&1
}

if installed "$@" && "$VENV/bin/python" -c 'import opencortex' >/dev/null 2>&1; then
  exit 0
fi

# One install at a time (two shells, or the tests and the chat, started together).
if command -v flock >/dev/null 2>&1; then
  exec 9<"$ROOT/kernel/install.sh"
  flock -w 900 9 || die "another kernel/install.sh has held the lock for 15 minutes"
  if installed "$@" && "$VENV/bin/python" -c 'import opencortex' >/dev/null 2>&1; then
    exit 0
  fi
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else return 1
  fi
}

apt_updated=
apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  say "installing $* (apt-get)"
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq || return 1
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

make_venv() {
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 && venv_works
}

if ! venv_works; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    [ "$PYTHON" = python3 ] && apt_install python3 python3-venv ||
      die "no $PYTHON found: install Python 3.11 or newer (Debian/Ubuntu: apt-get install python3 python3-venv), or set PYTHON to one"
  fi
  version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
    die "$PYTHON does not run"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "opencortex needs Python 3.11 or newer; $PYTHON is $version: install a newer one (e.g. apt-get install python3.11 python3.11-venv) and run: PYTHON=python3.11 bash kernel/install.sh"
  say "creating the virtual environment $VENV (Python $version)"
  if ! make_venv; then
    # Debian and Ubuntu ship venv's ensurepip in a package of its own.
    prefix=$("$PYTHON" -c 'import sys; print(sys.base_prefix)')
    if [ "$prefix" != /usr ]; then
      rm -rf "$VENV"
      die "$PYTHON cannot create a virtual environment ($PYTHON -m venv fails): install its venv/ensurepip support, or set PYTHON to another Python 3.11+"
    elif ! apt_install "python$version-venv"; then
      rm -rf "$VENV"
      die "$PYTHON cannot create a virtual environment; run: sudo apt-get install python$version-venv  then run this again"
    elif ! make_venv; then
      rm -rf "$VENV"
      die "$PYTHON cannot create a virtual environment even with python$version-venv installed; $PYTHON -m venv /tmp/venv-check shows why"
    fi
  fi
fi

# Keep the extras installed before (when the stamp is for this checkout) and add the new.
extras=()
if [ -f "$STAMP" ]; then
  read -r -a extras < <(sed -n 2p "$STAMP") || true
fi
for extra in "$@"; do
  [[ " ${extras[*]:-} " == *" $extra "* ]] || extras+=("$extra")
done
known=$("$VENV/bin/python" -c '
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["project"].get("optional-dependencies", {})))')
kept=()
for extra in "${extras[@]}"; do
  if [[ " $known " == *" $extra "* ]]; then kept+=("$extra")
  elif [[ " $* " == *" $extra "* ]]; then die "pyproject.toml has no extra '$extra' (it has: $known)"
  fi
done
spec="."
if [ "${#kept[@]}" -gt 0 ]; then spec=".[$(IFS=,; echo "${kept[*]}")]"; fi

say "installing opencortex ($spec) into .venv; the first time takes a minute or two"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$spec" ||
  die "pip install -e '$spec' failed (see above); fix that and run this again"
printf '%s\n%s\n' "$key" "${kept[*]:-}" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
say "installed: $VENV/bin/opencortex"
