// Protocol-level tests: a plain LSP client (vscode-languageserver-protocol, as VS Code's client uses)
// against the real draftwise server running the tiny model.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { ensureArtifactsDir, makeTempDir, MODELS, tail } from './lib.mjs';
import { insertTextOf, itemsOf, LspSession } from './lsp-session.mjs';

const model = MODELS.tiny;
const SOURCE = 'def fibonacci(n):\n    if n < 2:\n        return n\n    return ';

function endOf(text) {
  const lines = text.split('\n');
  return { line: lines.length - 1, character: lines[lines.length - 1].length };
}

describe('draftwise server over LSP (tiny model)', { timeout: 600_000 }, () => {
  let session;
  let workspace;
  let uri;
  let logFile;
  let earlyReply;
  let stateAfterEarlyReply;
  let version = 1;
  let text = SOURCE;

  before(async () => {
    workspace = makeTempDir('protocol');
    logFile = path.join(ensureArtifactsDir(), 'protocol-server.log');
    fs.rmSync(logFile, { force: true });
    const file = path.join(workspace, 'fib.py');
    fs.writeFileSync(file, SOURCE);
    uri = pathToFileURL(file).href;
    session = await LspSession.start({
      workspace,
      logFile,
      initializationOptions: { target: model.target(), maxTokens: model.maxTokens, device: 'cpu', drafter: 'auto' },
    });
    // Asked right away, while the models are (very likely) still loading.
    await session.open(uri, 'python', SOURCE, version);
    earlyReply = await session.inlineCompletion(uri, endOf(SOURCE));
    stateAfterEarlyReply = (await session.stats()).state;
  });

  after(async () => {
    if (session && session.process.exitCode === null) session.kill();
  });

  test('advertises inline completion, the accept commands, incremental sync and utf-16', () => {
    const caps = session.capabilities;
    assert.ok(caps.inlineCompletionProvider, 'inlineCompletionProvider');
    const sync = typeof caps.textDocumentSync === 'number' ? caps.textDocumentSync : caps.textDocumentSync.change;
    assert.equal(sync, 2, 'incremental text sync');
    assert.ok(caps.executeCommandProvider.commands.includes('draftwise.accepted'));
    assert.ok(caps.executeCommandProvider.commands.includes('draftwise.partiallyAccepted'));
    // The client offered only utf-16; the server may omit the field, which means utf-16.
    assert.ok([undefined, 'utf-16'].includes(caps.positionEncoding), `positionEncoding ${caps.positionEncoding}`);
  });

  test('a request that arrives while the models load gets an empty answer', () => {
    // States go loading -> ready only, so "still loading after the reply" means it was answered
    // while loading.
    if (stateAfterEarlyReply === 'loading') {
      assert.deepEqual(itemsOf(earlyReply), []);
    } else {
      assert.equal(stateAfterEarlyReply, 'ready');
    }
  });

  test('reports model loading with work-done progress and becomes ready', { timeout: model.loadTimeoutMs }, async () => {
    const stats = await session.waitReady(model.loadTimeoutMs);
    assert.equal(stats.state, 'ready');
    assert.equal(stats.error, null);
    assert.equal(stats.device, 'cpu');
    assert.ok(session.progressCreated.length >= 1, 'window/workDoneProgress/create was sent');
    const token = session.progressCreated[0];
    const kinds = session.progress.filter((p) => p.token === token).map((p) => p.value.kind);
    assert.equal(kinds[0], 'begin');
    assert.equal(kinds.at(-1), 'end');
  });

  let first;
  test('an automatic trigger gets a suggestion at the cursor with the accept command', { timeout: model.replyTimeoutMs }, async () => {
    const cursor = endOf(text);
    const items = itemsOf(await session.inlineCompletion(uri, cursor, 2));
    assert.equal(items.length, 1);
    first = items[0];
    assert.ok(insertTextOf(first).length > 0, 'non-empty suggestion');
    assert.deepEqual(first.range.start, cursor);
    assert.equal(first.range.end.line, cursor.line);
    assert.equal(first.command.command, 'draftwise.accepted');
    assert.equal(typeof first.command.arguments[0].id, 'string');
  });

  let firstStats;
  test('stats carry the last request\'s acceptance rate and tokens per forward', async () => {
    const stats = await session.stats();
    firstStats = stats.last;
    assert.ok(stats.requests >= 1);
    assert.equal(typeof stats.last.acceptance_rate, 'number');
    assert.equal(typeof stats.last.tokens_per_forward, 'number');
    assert.ok(stats.last.generated_tokens >= 1 && stats.last.generated_tokens <= model.maxTokens);
  });

  test('accept commands are acknowledged; a malformed one is refused', async () => {
    assert.equal(await session.executeCommand('draftwise.accepted', first.command.arguments), null);
    const partial = { ...first.command.arguments[0], acceptedLength: 1 };
    assert.equal(await session.executeCommand('draftwise.partiallyAccepted', [partial]), null);
    await assert.rejects(session.executeCommand('draftwise.partiallyAccepted', [{ id: first.command.arguments[0].id }]),
      (error) => error.code === -32602);
    const { suggestions } = await session.stats();
    assert.equal(suggestions.accepted, 1);
    assert.equal(suggestions.partiallyAccepted, 1);
  });

  test('typing the suggestion\'s first character (incremental change) leaves the rest as the suggestion', { timeout: model.replyTimeoutMs }, async () => {
    const suggestion = insertTextOf(first);
    const typed = suggestion[0];
    const cursor = endOf(text);
    version += 1;
    await session.change(uri, version, [{ range: { start: cursor, end: cursor }, text: typed }]);
    text += typed;
    const next = itemsOf(await session.inlineCompletion(uri, endOf(text), 2));
    if (suggestion.length === 1) {
      return; // nothing left to suggest from the first reply; any answer is fine
    }
    assert.equal(next.length, 1);
    assert.ok(insertTextOf(next[0]).startsWith(suggestion.slice(1)),
      `expected the rest ${JSON.stringify(suggestion.slice(1))}, got ${JSON.stringify(insertTextOf(next[0]))}`);
    assert.deepEqual(next[0].range.start, endOf(text));
  });

  test('the server\'s copy of the document matches after incremental edits (draftwise/documentText)', async () => {
    const synced = await session.connection.sendRequest('draftwise/documentText', { textDocument: { uri } });
    assert.equal(synced.text, text);
    assert.equal(synced.version, version);
  });

  test('an invoked trigger gets up to three distinct items, the automatic one first', { timeout: model.replyTimeoutMs }, async () => {
    // A fresh line, so that neither answer comes from the type-ahead memory.
    version += 1;
    const end = endOf(text);
    await session.change(uri, version, [{ range: { start: end, end }, text: '\n\nclass Stack:\n    def push(self, item):\n        ' }]);
    text += '\n\nclass Stack:\n    def push(self, item):\n        ';
    const automatic = itemsOf(await session.inlineCompletion(uri, endOf(text), 2));
    const invoked = itemsOf(await session.inlineCompletion(uri, endOf(text), 1));
    assert.equal(automatic.length, 1);
    assert.ok(invoked.length >= 2 && invoked.length <= 3, `${invoked.length} items`);
    assert.equal(insertTextOf(invoked[0]), insertTextOf(automatic[0]));
    assert.equal(new Set(invoked.map(insertTextOf)).size, invoked.length, 'distinct items');
  });

  test('maxTokens from workspace/didChangeConfiguration limits the next suggestion', { timeout: model.replyTimeoutMs }, async () => {
    // Only meaningful when the default limit let the first suggestion run longer.
    assert.ok(firstStats.generated_tokens > 2, `first suggestion had ${firstStats.generated_tokens} tokens`);
    await session.changeConfiguration({ target: model.target(), maxTokens: 2, device: 'cpu', drafter: 'auto' });
    // A different cursor position keeps the type-ahead memory out of it.
    version += 1;
    const cursor = endOf(text);
    await session.change(uri, version, [{ range: { start: cursor, end: cursor }, text: '\n\ndef square(x):\n    return ' }]);
    text += '\n\ndef square(x):\n    return ';
    await session.inlineCompletion(uri, endOf(text), 1);
    const stats = await session.stats();
    assert.ok(stats.last.generated_tokens <= 2, `generated ${stats.last.generated_tokens} tokens with maxTokens 2`);
  });

  test('shutdown and exit end the server with code 0', async () => {
    const result = await session.shutdown();
    assert.notEqual(result, null, `the server did not exit; log:\n${tail(logFile)}`);
    assert.equal(result.code, 0);
  });
});

describe('position encoding negotiation', { timeout: 120_000 }, () => {
  test('a client that prefers utf-8 gets utf-8', async () => {
    const workspace = makeTempDir('protocol-utf8');
    const session = await LspSession.start({
      workspace,
      logFile: path.join(ensureArtifactsDir(), 'protocol-server-utf8.log'),
      positionEncodings: ['utf-8', 'utf-16'],
      workDoneProgress: false,
      initializationOptions: { target: model.target(), maxTokens: model.maxTokens, device: 'cpu' },
    });
    try {
      assert.equal(session.capabilities.positionEncoding, 'utf-8');
      const result = await session.shutdown();
      assert.equal(result?.code, 0);
    } finally {
      session.kill();
    }
  });
});
