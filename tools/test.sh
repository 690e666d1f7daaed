#!/usr/bin/env bash
# Set up and run the test suite on a fresh Debian or Ubuntu machine with Python >= 3.10:
# the system packages the tests use when missing (Mosquitto: the uplink's broker; Chromium:
# the live view's page; systemd-analyze: the unit files), through sudo unless root; a venv
# with the package and its test extra; then pytest (arguments are passed on to it).
#
#   tools/test.sh                       # python3, venv .venv
#   PYTHON=python3.12 tools/test.sh     # another interpreter, venv .venv-3.12
#   CHROMIUM=/opt/google/chrome/chrome tools/test.sh   # a browser of your own (see docs/testing.md)
#   tools/test.sh -m 'not slow and not integration'    # less the integration tier (CI's 3.12 run;
#                                                      # -m replaces pyproject's 'not slow': name both)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || { echo "tools/test.sh: $PYTHON not found (set PYTHON=)"; exit 2; }
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "tools/test.sh: Python >= 3.10 needed, $PYTHON is $version"; exit 2; }
if [ "$PYTHON" = python3 ]; then VENV=${VENV:-.venv}; else VENV=${VENV:-.venv-$version}; fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || missing+=(mosquitto)
command -v systemd-analyze >/dev/null || missing+=(systemd)
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "${CHROMIUM:-}" ] && { [ -z "$browser" ] || [[ "$(readlink -f "$browser")" == /snap/* ]]; }; then
  if grep -qi '^ID=ubuntu' /etc/os-release 2>/dev/null; then
    # Ubuntu packages Chromium as a snap only, and a snap writes its screenshots into a
    # /tmp of its own, where the live view's test cannot read them.
    echo "tools/test.sh: Ubuntu's Chromium is a snap, which the live view's test cannot use;"
    echo "  set CHROMIUM to a Chrome or Chromium that is not a snap, e.g. Google Chrome's .deb:"
    echo "  CHROMIUM=/opt/google/chrome/chrome tools/test.sh   (docs/testing.md)"
    exit 2
  fi
  missing+=(chromium)
fi
"$PYTHON" -c 'import ensurepip' 2>/dev/null || missing+=("python$version-venv")
if [ ${#missing[@]} -gt 0 ]; then
  echo "tools/test.sh: installing ${missing[*]} (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then "$PYTHON" -m venv "$VENV"; fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e '.[test]'
echo "tools/test.sh: $("$VENV/bin/python" -V), onnxruntime $("$VENV/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)'), venv $VENV"
# -rs: the reason of any skip is printed (CI fails on a skip: every test must run here).
exec "$VENV/bin/python" -m pytest -rs "$@"
