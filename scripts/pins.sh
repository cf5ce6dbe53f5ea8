#!/usr/bin/env bash
# The dev and CI pins (constraints.txt), and how to move them forward.
#
#   scripts/pins.sh freeze   write constraints.txt from .venv: every package `make venv` installed, at the
#                            version installed (run after a green `make test`, so the pins are versions CI passed)
#   scripts/pins.sh latest   build .cache/venv-latest with the newest release of every package
#                            requirements-dev.txt names (torch stays pinned: an unpinned torch is a multi-GB
#                            CUDA build), run the suite there and print what broke, and which packages
#                            moved; constraints.txt is not touched. TESTS=... narrows the run (default: the
#                            doctor/profile corpus and the unit tests; TESTS=all for everything).
#
# Why: a landing runs `.ci/run` on a fresh machine, which installs whatever pip resolves that day. With
# unpinned test packages, a release upstream (transformers 5.25.0 once) failed a landing that had passed
# the day before. The package's own ranges in pyproject.toml stay open for users.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PIN=$(grep -E '^torch==' constraints.txt | head -1)

freeze() {
  test -x .venv/bin/python || { echo "pins: no .venv; run 'make venv' first" >&2; exit 2; }
  {
    echo "# Dev and CI pins, written by 'scripts/pins.sh freeze' from a venv whose 'make test' passed."
    echo "# Never let pip resolve an unpinned torch here: it would pull a multi-GB CUDA build."
    echo "# Move them forward with 'scripts/pins.sh latest' (docs/DEVELOPING.md, \"Pins\")."
    echo "${TORCH_PIN}"
    .venv/bin/python -m pip freeze --exclude-editable 2>/dev/null \
      | grep -v -i -E '^(torch|torchscalpel|pip|setuptools|wheel)==' | grep -E '^[A-Za-z0-9_.-]+==' | sed 's/+cpu$//'
  } > constraints.txt.new
  mv constraints.txt.new constraints.txt
  echo "pins: constraints.txt holds $(grep -c '==' constraints.txt) pins"
}

latest() {
  local venv=.cache/venv-latest tests=${TESTS:-"tests/unit tests/integration/test_corpus.py tests/integration/test_doctor_fixtures.py"}
  [ "$tests" = all ] && tests="tests"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  echo "$TORCH_PIN" > .cache/torch-only-constraints.txt
  # Only torch constrained: every other package at its newest release.
  PIP_CONSTRAINT=$(pwd)/.cache/torch-only-constraints.txt "$venv/bin/python" -m pip install -q \
    --upgrade --upgrade-strategy eager -r requirements-dev.txt
  echo "pins: packages whose newest release differs from constraints.txt:"
  "$venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null | while IFS== read -r name version; do
    pinned=$(grep -i -E "^${name}==" constraints.txt | head -1 | cut -d= -f3 || true)
    [ -n "$pinned" ] && [ "$pinned" != "${version%+cpu}" ] && echo "  ${name}: ${pinned} -> ${version}"
  done || true
  local rc=0
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pytest $tests -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" -rf || rc=$?
  echo "pins: the suite against the newest releases exited ${rc}; 0 means 'scripts/pins.sh freeze' from a venv"
  echo "pins: built the same way (or 'make venv' after raising the pins by hand) can move them forward"
  return "$rc"
}

case "${1:-}" in
  freeze) freeze ;;
  latest) latest ;;
  *) echo "usage: scripts/pins.sh freeze|latest" >&2; exit 2 ;;
esac
