// Runs Neovim with the plugin from this repository against the real server, and reads its state
// over Neovim's own RPC (--listen / --remote-expr / --remote-send).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { descendants, here, makeTempDir, serverCommand, serverEnv, spawnLogged, stopTree, tool, waitFor } from './lib.mjs';

export const INIT = path.join(here, 'nvim', 'init.lua');

/**
 * Environment for an isolated Neovim (no user config or plugins) that starts our server; with `tap`
 * ({log, holdLoadUntil?}) the server runs behind lsp-tap.mjs, which logs the traffic (and may hold
 * the model load until a file exists).
 */
export function nvimEnv({ home, settings, serverLog, extraEnv = {}, tap }) {
  const env = { ...serverEnv(), ...extraEnv };
  for (const dir of ['config', 'data', 'state', 'cache']) {
    env[`XDG_${dir.toUpperCase()}_HOME`] = path.join(home, dir);
  }
  let command = serverCommand(['--log-file', serverLog]);
  if (tap) {
    const hold = tap.holdLoadUntil ? ['--hold-load-until', tap.holdLoadUntil] : [];
    command = [process.execPath, path.join(here, 'lsp-tap.mjs'), tap.log, ...hold, '--', ...command];
  }
  env.DRAFTWISE_TEST_CMD = JSON.stringify(command);
  env.DRAFTWISE_TEST_SETTINGS = JSON.stringify(settings);
  return env;
}

export class NvimClient {
  constructor(socket) {
    this.socket = socket;
    this.nvim = tool('nvim');
  }

  /** JSON value of v:lua.draftwise_probe(what) (see nvim/init.lua). */
  probe(what) {
    const out = execFileSync(this.nvim, ['--server', this.socket, '--remote-expr', `v:lua.draftwise_probe('${what}')`], {
      encoding: 'utf8',
      timeout: 10_000,
    });
    const value = JSON.parse(out);
    if (value && value.probe_error) throw new Error(`probe ${what}: ${value.probe_error}`);
    return value;
  }

  /** Types keys (Neovim key notation) as if from the keyboard. */
  send(keys) {
    execFileSync(this.nvim, ['--server', this.socket, '--remote-send', keys], { timeout: 10_000 });
  }

  /** Runs Lua in Neovim (a statement, through <Cmd>, so the mode is kept). */
  lua(code) {
    this.send(`<Cmd>lua ${code.replace(/</g, '<lt>')}<CR>`);
  }

  /**
   * Opens `file`, written afresh with `text`, in the current window (normal mode, cursor on its
   * first line), and waits until the server and the plugin serve it: a test that starts with it
   * does not depend on what earlier tests left in a buffer.
   */
  async openFresh(file, text) {
    fs.writeFileSync(file, text);
    this.send(`<C-\\><C-n>:edit ${file.replace(/ /g, '\\ ')}<CR>`);
    return waitFor(`${path.basename(file)} open and attached`, () => {
      const state = this.probe('attached');
      return state.name === file && state.lsp && (state.ghost || state.native) && this.probe('mode') === 'n' ? state : null;
    }, { timeoutMs: 20_000, intervalMs: 100 });
  }

  async waitReady(timeoutMs) {
    return waitFor('the draftwise server to be ready in Neovim', () => {
      const state = this.probe('state');
      if (state.error) throw new Error(state.error);
      if (state.stats && state.stats.state === 'failed') {
        throw new Error(`model load failed: ${state.stats.error}`);
      }
      return state.stats && state.stats.state === 'ready' ? state : null;
    }, { timeoutMs, intervalMs: 300 });
  }

  async waitSocket() {
    await waitFor(`Neovim to listen on ${this.socket}`, () => fs.existsSync(this.socket), { timeoutMs: 20_000, intervalMs: 100 });
  }
}

/** Neovim without a UI (--headless), for driving through RPC. */
export class HeadlessNvim extends NvimClient {
  static async start({ file, settings, logDir, name, env: extraEnv = {}, tap }) {
    const home = makeTempDir(`nvim-${name}`);
    const socket = path.join(home, 'nvim.sock');
    const nvim = new HeadlessNvim(socket);
    nvim.home = home;
    nvim.serverLog = path.join(logDir, `${name}-server.log`);
    nvim.log = path.join(logDir, `${name}-nvim.log`);
    fs.rmSync(nvim.serverLog, { force: true });
    fs.rmSync(nvim.log, { force: true });
    if (tap) {
      nvim.tapLog = tap.log;
      fs.rmSync(tap.log, { force: true });
    }
    nvim.process = spawnLogged(nvim.nvim, ['--headless', '--listen', socket, '-u', INIT, file], {
      logFile: nvim.log,
      cwd: path.dirname(file),
      env: nvimEnv({ home, settings, serverLog: nvim.serverLog, extraEnv, tap }),
    });
    await nvim.waitSocket();
    return nvim;
  }

  /** Process id of the language server Neovim started (the newest, after a restart). */
  serverPid() {
    const pids = descendants(this.process.pid).filter((pid) => {
      try {
        return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes('serve');
      } catch {
        return false;
      }
    });
    return pids.length ? Math.max(...pids) : null;
  }

  async stop() {
    try {
      this.send('<C-\\><C-n>:qa!<CR>');
    } catch {
      // already gone
    }
    await stopTree(this.process, { graceMs: 3000 });
  }
}

/** Neovim with its real terminal UI inside a private tmux server; keys are typed with send-keys. */
export class TmuxNvim extends NvimClient {
  static async start({ file, settings, logDir, name, width = 100, height = 30, env: extraEnv = {} }) {
    const home = makeTempDir(`tmux-${name}`);
    const socket = path.join(home, 'nvim.sock');
    const t = new TmuxNvim(socket);
    t.home = home;
    t.tmuxSocket = path.join(home, 'tmux.sock');
    t.serverLog = path.join(logDir, `${name}-server.log`);
    fs.rmSync(t.serverLog, { force: true });
    const env = nvimEnv({ home, settings, serverLog: t.serverLog, extraEnv });
    const envArgs = [];
    for (const key of ['DRAFTWISE_TEST_CMD', 'DRAFTWISE_TEST_SETTINGS', 'PYTHONPATH', 'XDG_CONFIG_HOME',
      'XDG_DATA_HOME', 'XDG_STATE_HOME', 'XDG_CACHE_HOME', ...Object.keys(extraEnv)]) {
      envArgs.push('-e', `${key}=${env[key]}`);
    }
    t.tmux(['-f', '/dev/null', 'new-session', '-d', '-s', 'draftwise', '-x', String(width), '-y', String(height),
      ...envArgs, t.nvim, '--listen', socket, '-u', INIT, file], { env: { ...env, TERM: 'xterm-256color' } });
    await t.waitSocket();
    return t;
  }

  tmux(args, options = {}) {
    return execFileSync('tmux', ['-S', this.tmuxSocket, ...args], { encoding: 'utf8', timeout: 10_000, ...options });
  }

  /** Types literal text. */
  type(text) {
    this.tmux(['send-keys', '-t', 'draftwise', '-l', text]);
  }

  /** Presses keys by tmux name (Tab, Escape, Enter, C-s, ...). */
  press(...keys) {
    this.tmux(['send-keys', '-t', 'draftwise', ...keys]);
  }

  screen() {
    return this.tmux(['capture-pane', '-p', '-t', 'draftwise']);
  }

  async stop() {
    try {
      this.tmux(['kill-server']);
    } catch {
      // already gone
    }
  }
}

/** The buffer expected after accepting: `insert` replaces bytes [start_col, end_col) of row. */
export function applySuggestion(lines, suggestion) {
  const line = Buffer.from(lines[suggestion.row], 'utf8');
  const before = line.subarray(0, suggestion.start_col).toString('utf8');
  const after = line.subarray(suggestion.end_col).toString('utf8');
  const replaced = (before + suggestion.insert + after).split('\n');
  return [...lines.slice(0, suggestion.row), ...replaced, ...lines.slice(suggestion.row + 1)];
}

/**
 * Text as Neovim draws it: control characters in caret notation (^S), C1 controls as <9b>.
 * The tiny model writes arbitrary bytes, so its suggestions do contain them.
 */
export function displayed(text) {
  return [...text]
    .map((ch) => {
      const c = ch.codePointAt(0);
      if (c === 0x7f) return '^?';
      if (c < 0x20 && ch !== '\t') return `^${String.fromCharCode(c + 64)}`;
      if (c >= 0x80 && c < 0xa0) return `<${c.toString(16)}>`;
      return ch;
    })
    .join('');
}
