// Shared pieces of the editor tests: where things are, which server command and model to use,
// polling, and process cleanup.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');
export const cacheDir = process.env.DRAFTWISE_EDITORS_CACHE ?? path.join(repoRoot, '.cache', 'editors');
export const binDir = path.join(cacheDir, 'bin');
export const artifactsDir = path.join(here, 'artifacts');
export const python = process.env.DRAFTWISE_PYTHON ?? path.join(repoRoot, '.venv', 'bin', 'python');

/** Model presets the tests can run against. */
export const MODELS = {
  // Random 2-layer model with a real tokenizer: nonsense text, but a real suggestion from the real
  // server, in milliseconds.
  tiny: { target: () => tinyModelDir(), maxTokens: 12, loadTimeoutMs: 180_000, replyTimeoutMs: 60_000 },
  // Qwen2.5-Coder 0.5B: a few seconds per suggestion on a laptop CPU.
  real: { target: () => 'qwen2.5-coder-0.5b', maxTokens: 16, loadTimeoutMs: 300_000, replyTimeoutMs: 180_000 },
};

let tinyDir;
/** Builds the tiny test model once (about 2 s) into the cache and returns its directory. */
export function tinyModelDir() {
  if (tinyDir) return tinyDir;
  const dir = path.join(cacheDir, 'tiny-model');
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    execFileSync(python, [path.join(here, 'make_tiny_model.py'), dir], {
      cwd: repoRoot,
      env: serverEnv(),
      stdio: ['ignore', 'inherit', 'inherit'],
    });
  }
  tinyDir = dir;
  return dir;
}

/** Whether the real 0.5B model is on this machine (the tests that need it skip otherwise). */
export function realModelPresent() {
  const home = process.env.DRAFTWISE_HOME ?? path.join(os.homedir(), '.cache', 'draftwise');
  return fs.existsSync(path.join(home, 'models', 'qwen2.5-coder-0.5b', 'config.json'));
}

export function serverEnv() {
  const env = { ...process.env, PYTHONUNBUFFERED: '1' };
  // Until the package is installed the modules are imported from the checkout.
  env.PYTHONPATH = env.PYTHONPATH ? `${repoRoot}${path.delimiter}${env.PYTHONPATH}` : repoRoot;
  return env;
}

/**
 * The argv that starts the language server: $DRAFTWISE_SERVER_CMD (a JSON list) if set, else the
 * project's installed `draftwise`, else its module run by the project's Python. Extra arguments
 * (e.g. --log-file) come after `serve`.
 */
export function serverCommand(extra = []) {
  if (process.env.DRAFTWISE_SERVER_CMD) {
    return [...JSON.parse(process.env.DRAFTWISE_SERVER_CMD), ...extra];
  }
  const installed = path.join(repoRoot, '.venv', 'bin', 'draftwise');
  if (fs.existsSync(installed)) {
    return [installed, 'serve', ...extra];
  }
  return [python, '-m', 'lsp_server.cli', 'serve', ...extra];
}

export function tool(name) {
  const file = path.join(binDir, name);
  if (!fs.existsSync(file)) {
    throw new Error(`${file} is missing: run editor-clients/setup-editors.sh`);
  }
  return file;
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls fn until it returns a truthy value; throws with `what` and the last value after timeoutMs. */
export async function waitFor(what, fn, { timeoutMs = 30_000, intervalMs = 200 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  let lastError;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (last) return last;
    } catch (error) {
      lastError = error;
    }
    await sleep(intervalMs);
  }
  const detail = lastError ? `; last error: ${lastError.message ?? lastError}` : `; last value: ${JSON.stringify(last)}`;
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
}

const tempDirs = [];
process.on('exit', () => {
  if (process.env.DRAFTWISE_KEEP_TEMP) return;
  for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
});

/**
 * What `draftwise complete` gives for `text` at `position` (line and character, as LSP counts them) in
 * a file called `name`, with the server's settings as command-line flags (`args`): its JSON, whose
 * `suggestion` ({text, replace}, or null) is the edit an editor would insert. The editor tests hold
 * what the user accepted against it: the same engine, prompt and shaping, with no editor in between.
 */
export function draftwiseComplete(name, text, position, args) {
  const file = path.join(makeTempDir('complete'), name);
  fs.writeFileSync(file, text);
  const out = execFileSync(python, ['-m', 'lsp_server.cli', 'complete', file, '--line', String(position.line),
    '--character', String(position.character), '--json', ...args],
  { cwd: repoRoot, env: serverEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 120_000 });
  return JSON.parse(out);
}

/**
 * `draftwise complete`'s flags for what the editor's server runs: the target, maxTokens, the CPU, and
 * the weight format the server chose (its last `draftwise/stats` reply in the protocol log), so that
 * `complete` does not choose for itself.
 */
export function completeFlags(tapLog, model) {
  const replies = readTap(tapLog).filter(({ direction, message }) => direction === 'to-editor'
    && typeof message.result?.weights === 'string' && message.result?.target === model.target());
  const weights = replies.at(-1)?.message.result.weights;
  if (!/^(fp32|bf16|int8|int4|gguf)$/.test(weights ?? '')) throw new Error(`no weight format in the server's stats: ${weights}`);
  return ['--target', model.target(), '--max-tokens', String(model.maxTokens), '--device', 'cpu', '--weights', weights];
}

/** `text` with `suggestion` ({text, replace} from draftwiseComplete) inserted at character `offset`. */
export function withSuggestion(text, offset, suggestion) {
  return text.slice(0, offset) + suggestion.text + text.slice(offset + suggestion.replace);
}

/** A fresh directory, removed when the test process exits (kept with DRAFTWISE_KEEP_TEMP=1). */
export function makeTempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `draftwise-${prefix}-`));
  tempDirs.push(dir);
  return dir;
}

export function ensureArtifactsDir() {
  fs.mkdirSync(artifactsDir, { recursive: true });
  return artifactsDir;
}

/** Process ids of pid's descendants (from /proc), deepest first. */
export function descendants(pid) {
  const children = new Map();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (!children.has(ppid)) children.set(ppid, []);
      children.get(ppid).push(Number(entry));
    } catch {
      // the process ended while we looked
    }
  }
  const out = [];
  const visit = (p) => {
    for (const child of children.get(p) ?? []) {
      visit(child);
      out.push(child);
    }
  };
  visit(pid);
  return out;
}

/** Stops a process we started and everything it started, by pid. */
export async function stopTree(child, { graceMs = 3000 } = {}) {
  if (!child || child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const pids = [...descendants(child.pid), child.pid];
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      // already gone
    }
  }
  const exited = new Promise((resolve) => child.once('exit', resolve));
  await Promise.race([exited, sleep(graceMs)]);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** Spawns a long-running helper with its output kept in a log file (shown when a test fails). */
export function spawnLogged(command, args, { logFile, ...options }) {
  const out = fs.openSync(logFile, 'a');
  const child = spawn(command, args, { ...options, stdio: ['ignore', out, out] });
  fs.closeSync(out);
  return child;
}

export function tail(file, lines = 40) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return `(no ${file})`;
  }
}

/** Messages logged by lsp-tap.mjs: [{direction: 'to-server' | 'to-editor', time, message}]. */
export function readTap(file) {
  if (!fs.existsSync(file)) return [];
  const entries = [];
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line.trim() === '') continue;
    try {
      const entry = JSON.parse(line);
      if (entry.message) entries.push(entry); // the tap's own notes have none
    } catch {
      // the line being written right now
    }
  }
  return entries;
}

/** Whether an LSP position is the given one. */
function samePosition(a, b) {
  return a.line === b.line && a.character === b.character;
}

/**
 * What the tap saw around a model load slower than the editor's first request, for the inline
 * completion requests for `uri` at `position`: `first` (the first of them) and `firstReply`, `loadEnd`
 * (the `$/progress` end after it), `retry` (the first of them sent after the load ended) and
 * `retryReply`, and `changes`: the editor's didChange notifications for `uri` between `first` and
 * `retry` (keystrokes). Each entry is the tap's, with its `index` in the log.
 */
export function loadRetry(tapLog, uri, position) {
  const entries = readTap(tapLog).map((entry, index) => ({ ...entry, index }));
  const isRequest = ({ direction, message }) => direction === 'to-server' && message.method === 'textDocument/inlineCompletion'
    && message.params.textDocument.uri === uri && samePosition(message.params.position, position);
  const replyTo = (request) => request && entries.find(({ direction, message, index }) => index > request.index
    && direction === 'to-editor' && message.method === undefined && message.id === request.message.id);
  const first = entries.find(isRequest);
  const loadEnd = first && entries.find(({ direction, message, index }) => index > first.index && direction === 'to-editor'
    && message.method === '$/progress' && message.params?.value?.kind === 'end');
  const retry = loadEnd && entries.find((entry) => entry.index > loadEnd.index && isRequest(entry));
  const changes = first ? entries.filter(({ direction, message, index }) => index > first.index
    && (retry === undefined || index < retry.index) && direction === 'to-server'
    && message.method === 'textDocument/didChange' && message.params.textDocument.uri === uri) : [];
  return { first, firstReply: replyTo(first), loadEnd, retry, retryReply: replyTo(retry), changes };
}

/** The items of an inline completion reply (an entry of the tap), [] for none or null. */
export function replyItems(reply) {
  const result = reply?.message?.result;
  return result ? (Array.isArray(result) ? result : result.items ?? []) : [];
}

/** Whether the tap saw an inline completion request for `uri` at `position`. */
export function askedAt(tapLog, uri, position) {
  return readTap(tapLog).some(({ direction, message }) => direction === 'to-server'
    && message.method === 'textDocument/inlineCompletion' && message.params.textDocument.uri === uri
    && samePosition(message.params.position, position));
}
