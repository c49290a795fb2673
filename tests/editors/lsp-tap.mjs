// Test helper: sits between an editor and the language server on stdio, passes every byte through
// unchanged, and writes each decoded LSP message as a JSON line to a log file, so a test can see
// exactly what the server suggested and which commands the editor sent back.
//
//   node lsp-tap.mjs LOG_FILE -- SERVER_COMMAND [ARGS...]
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const [logFile, separator, command, ...args] = process.argv.slice(2);
if (!logFile || separator !== '--' || !command) {
  process.stderr.write('usage: node lsp-tap.mjs LOG_FILE -- SERVER_COMMAND [ARGS...]\n');
  process.exit(2);
}

const log = fs.createWriteStream(logFile, { flags: 'a' });

/** Splits a byte stream into LSP messages (Content-Length framing) and logs each one. */
function tap(direction) {
  let buffer = Buffer.alloc(0);
  return (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    for (;;) {
      const headerEnd = buffer.indexOf('\r\n\r\n');
      if (headerEnd === -1) return;
      const match = /content-length: *(\d+)/i.exec(buffer.subarray(0, headerEnd).toString('ascii'));
      if (!match) {
        log.write(`${JSON.stringify({ direction, unframed: buffer.toString('utf8') })}\n`);
        buffer = Buffer.alloc(0);
        return;
      }
      const start = headerEnd + 4;
      const end = start + Number(match[1]);
      if (buffer.length < end) return;
      const body = buffer.subarray(start, end).toString('utf8');
      buffer = buffer.subarray(end);
      log.write(`${JSON.stringify({ direction, time: Date.now(), message: JSON.parse(body) })}\n`);
    }
  };
}

const server = spawn(command, args, { stdio: ['pipe', 'pipe', 'inherit'] });
log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), started: [command, ...args], cwd: process.cwd() })}\n`);
server.on('error', (error) => {
  log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), error: String(error) })}\n`);
  log.end(() => process.exit(127));
});
const toServer = tap('to-server');
const toEditor = tap('to-editor');
process.stdin.on('data', (chunk) => {
  toServer(chunk);
  server.stdin.write(chunk);
});
process.stdin.on('end', () => server.stdin.end());
server.stdout.on('data', (chunk) => {
  toEditor(chunk);
  process.stdout.write(chunk);
});
server.on('exit', (code, signal) => {
  log.write(`${JSON.stringify({ direction: 'tap', time: Date.now(), exit: code, signal })}\n`);
  log.end(() => process.exit(code ?? (signal ? 1 : 0)));
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.kill(signal));
}

