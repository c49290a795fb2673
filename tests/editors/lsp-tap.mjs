// Test helper: sits between an editor and the language server on stdio, passes every byte through
// unchanged, and writes each decoded LSP message as a JSON line to a log file, so a test can see
// exactly what the server suggested and which commands the editor sent back.
//
//   node lsp-tap.mjs LOG_FILE [--hold-load-until FILE] -- SERVER_COMMAND [ARGS...]
//
// --hold-load-until FILE: a model load slower than the editor's first requests, whatever the CPU.
// The server loads its models after `initialized`; the tap holds that notification, and everything
// the editor sends after it, until FILE exists (the test creates it once the editor has asked).
// Then it passes `initialized` on and keeps holding the rest until the server reports the load
// begun (`$/progress` begin), so the held requests reach the server while it loads. The editor's
// answers to the server's own requests (the progress token) are never held.
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const argv = process.argv.slice(2);
const logFile = argv.shift();
let holdUntil = null;
while (argv.length && argv[0] !== '--') {
  const option = argv.shift();
  if (option === '--hold-load-until' && argv.length) {
    holdUntil = argv.shift();
  } else {
    process.stderr.write(`lsp-tap: unknown option ${option}\n`);
    process.exit(2);
  }
}
const [separator, command, ...args] = argv;
if (!logFile || separator !== '--' || !command) {
  process.stderr.write('usage: node lsp-tap.mjs LOG_FILE [--hold-load-until FILE] -- SERVER_COMMAND [ARGS...]\n');
  process.exit(2);
}

const log = fs.createWriteStream(logFile, { flags: 'a' });

/** Splits a byte stream into LSP messages (Content-Length framing), logs each one and hands it on. */
function tap(direction, onMessage) {
  let buffer = Buffer.alloc(0);
  return (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    for (;;) {
      const headerEnd = buffer.indexOf('\r\n\r\n');
      if (headerEnd === -1) return;
      const match = /content-length: *(\d+)/i.exec(buffer.subarray(0, headerEnd).toString('ascii'));
      if (!match) {
        log.write(`${JSON.stringify({ direction, unframed: buffer.toString('utf8') })}\n`);
        onMessage(buffer, null);
        buffer = Buffer.alloc(0);
        return;
      }
      const start = headerEnd + 4;
      const end = start + Number(match[1]);
      if (buffer.length < end) return;
      const body = buffer.subarray(start, end).toString('utf8');
      const bytes = buffer.subarray(0, end);
      buffer = buffer.subarray(end);
      const message = JSON.parse(body);
      log.write(`${JSON.stringify({ direction, time: Date.now(), message })}\n`);
      onMessage(bytes, message);
    }
  };
}

// What the editor sends, held while the load is (see --hold-load-until).
// Phases: 'pass' (no hold), 'before-initialized', 'held' (waiting for FILE), 'loading' (waiting for
// the server's progress begin).
let phase = holdUntil ? 'before-initialized' : 'pass';
const held = [];
function note(text) {
  log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), note: text })}\n`);
}
function flushHeld() {
  phase = 'pass';
  note(`passing on ${held.length} held messages`);
  for (const bytes of held.splice(0)) server.stdin.write(bytes);
}
function toServerMessage(bytes, message) {
  const isReply = message && message.method === undefined; // the editor's answer to a server request
  if (phase === 'before-initialized' && message?.method === 'initialized') {
    phase = 'held';
    note(`holding initialized and what follows until ${holdUntil} exists`);
    held.push(bytes);
    const timer = setInterval(() => {
      if (!fs.existsSync(holdUntil)) return;
      clearInterval(timer);
      phase = 'loading';
      note('passing on initialized; holding the rest until the load has begun');
      server.stdin.write(held.shift());
      // Servers that report no progress: the rest goes on after a while anyway.
      setTimeout(() => phase === 'loading' && flushHeld(), 30_000).unref();
    }, 100);
    return;
  }
  if ((phase === 'held' || phase === 'loading') && !isReply) {
    held.push(bytes);
    return;
  }
  server.stdin.write(bytes);
}
function toEditorMessage(bytes, message) {
  process.stdout.write(bytes);
  if (phase === 'loading' && message?.method === '$/progress' && message.params?.value?.kind === 'begin') {
    flushHeld();
  }
}

const server = spawn(command, args, { stdio: ['pipe', 'pipe', 'inherit'] });
log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), started: [command, ...args], cwd: process.cwd() })}\n`);
server.on('error', (error) => {
  log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), error: String(error) })}\n`);
  log.end(() => process.exit(127));
});
const toServer = tap('to-server', toServerMessage);
const toEditor = tap('to-editor', toEditorMessage);
process.stdin.on('data', toServer);
process.stdin.on('end', () => server.stdin.end());
server.stdout.on('data', toEditor);
server.on('exit', (code, signal) => {
  log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), exit: code, signal })}\n`);
  log.end(() => process.exit(code ?? (signal ? 1 : 0)));
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.kill(signal));
}

