#!/usr/bin/env bash
# Run .ci/run the way a landing does: a fresh clone of a commit (default HEAD) in an empty folder with no
# ../shared beside it, a new venv, no pip, inductor or mypy cache, an empty TMPDIR and nothing of this shell's
# environment but PATH and HOME (the machine's pip configuration, where its local wheels are listed, lives
# under HOME; the CI machine has the same). Run it before every
# submission (docs/DEVELOPING.md, "Before a submission"); it prints .ci/run's phases and its exit status.
#
#   scripts/fresh_ci.sh [COMMIT]      (the log is kept in the printed folder)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=${1:-HEAD}
root=$(mktemp -d /tmp/scalpel-fresh-ci.XXXXXX)
mkdir -p "$root/cache" "$root/tmp"
git clone -q --no-hardlinks "$repo" "$root/main"
git -C "$root/main" checkout -q "$(git -C "$repo" rev-parse "$commit")"
echo "fresh-ci: $(git -C "$root/main" log --oneline -1) in $root/main (no ../shared: $(test -e "$root/shared" && echo no || echo yes))"
rc=0
# env -i: nothing of this shell's environment (PYTHONPATH, a venv, pip settings) reaches the run.
env -i PATH="$PATH" HOME="$HOME" ${PYENV_ROOT:+PYENV_ROOT="$PYENV_ROOT"} TMPDIR="$root/tmp" \
  XDG_CACHE_HOME="$root/cache" LANG=C.UTF-8 PIP_NO_CACHE_DIR=1 "$root/main/.ci/run" > "$root/ci.log" 2>&1 || rc=$?
grep -E '^ci: |passed|failed' "$root/ci.log" | tail -20
echo "fresh-ci: exit ${rc}; the whole log is $root/ci.log"
exit "$rc"
