#!/usr/bin/env bash
# The editor tests in one command: installs whatever is missing (editor-clients/setup-editors.sh),
# then runs the protocol, Neovim and VS Code tests against the real server.
#
#   tests/editors/run.sh            # everything; the Qwen2.5-Coder 0.5B tests skip if it is not pulled
#   tests/editors/run.sh --tiny     # only the tiny-model tests (about 2 minutes once installed)
#   tests/editors/run.sh FILE...    # only these test files (e.g. tests/editors/nvim.test.mjs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${DRAFTWISE_EDITORS_CACHE:-$ROOT/.cache/editors}

node_args=(--test --test-concurrency=1 --test-reporter=spec)
files=()
for arg in "$@"; do
  case $arg in
    --tiny) node_args+=("--test-skip-pattern=0\\.5B") ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) files+=("$arg") ;;
  esac
done
((${#files[@]})) || files=("$ROOT"/tests/editors/*.test.mjs)

"$ROOT/editor-clients/setup-editors.sh"

export PATH="$CACHE/bin:$PATH"
export DRAFTWISE_EDITORS_CACHE=$CACHE
cd "$ROOT"
started=$(date +%s)
status=0
node "${node_args[@]}" "${files[@]}" || status=$?
echo "editor tests took $(($(date +%s) - started)) s; logs and screenshots in tests/editors/artifacts/" >&2
exit $status
