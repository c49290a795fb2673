// VS Code 1.139 (code-server) with the packaged extension, driven by headless Chromium: the status
// bar, ghost text from the real server, Tab to accept, the saved document, the accept command.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { ensureArtifactsDir, makeTempDir, MODELS, readTap, realModelPresent, tail, waitFor } from './lib.mjs';
import { CodeServer, displayed } from './vscode-harness.mjs';

const SOURCE = 'def fibonacci(n):\n    if n < 2:\n        return n\n    return ';
const REAL_SOURCE = 'def factorial(n):\n    if n <= 1:\n        return 1\n    return ';

/** Position (UTF-16 code units, as VS Code counts) of the end of text. */
function endOf(text) {
  const lines = text.split('\n');
  return { line: lines.length - 1, character: lines.at(-1).length };
}

function offsetOf(text, position) {
  const lines = text.split('\n');
  return lines.slice(0, position.line).reduce((n, l) => n + l.length + 1, 0) + position.character;
}

/** The inline completion item the server sent for a request at `position` in `uri` (latest first). */
function suggestionAt(tapLog, uri, position) {
  const entries = readTap(tapLog);
  const requests = new Map();
  for (const { direction, message } of entries) {
    if (direction === 'to-server' && message.method === 'textDocument/inlineCompletion'
      && message.params.textDocument.uri === uri
      && message.params.position.line === position.line && message.params.position.character === position.character) {
      requests.set(message.id, message);
    }
  }
  const replies = entries.filter(({ direction, message }) => direction === 'to-editor' && requests.has(message.id)
    && message.result && (message.result.items ?? message.result).length > 0);
  const last = replies.at(-1);
  return last ? (last.message.result.items ?? last.message.result)[0] : null;
}

function acceptCommands(tapLog) {
  return readTap(tapLog)
    .filter(({ direction, message }) => direction === 'to-server' && message.method === 'workspace/executeCommand')
    .map(({ message }) => message.params);
}

async function typeAndAccept(vscode, file, source, typed, { replyTimeoutMs, screenshotName }) {
  const uri = pathToFileURL(file).href;
  await vscode.openFile(path.basename(file), source.split('\n')[0]);
  await vscode.press('Control', 'End');
  await vscode.page.keyboard.type(typed, { delay: 60 });
  const before = source + typed;
  const cursor = endOf(before);
  const ghost = await waitFor('ghost text in the editor', () => vscode.ghostText(), { timeoutMs: replyTimeoutMs, intervalMs: 250 });
  const item = await waitFor('the server\'s reply in the protocol log', () => suggestionAt(vscode.tapLog, uri, cursor),
    { timeoutMs: 5000 });
  const insertText = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
  // What is drawn on the cursor's line is the server's first line after what is typed.
  const firstLine = insertText.split('\n')[0].slice(cursor.character - item.range.start.character);
  assert.equal(ghost.inline.trimEnd(), displayed(firstLine).trimEnd(),
    `ghost ${JSON.stringify(ghost)} vs item ${JSON.stringify(insertText)}`);
  await vscode.screenshot(path.join(ensureArtifactsDir(), `${screenshotName}-ghost-text.png`));

  const acceptedBefore = acceptCommands(vscode.tapLog).length;
  await vscode.page.keyboard.press('Tab');
  const expected = before.slice(0, offsetOf(before, item.range.start)) + insertText + before.slice(offsetOf(before, item.range.end));
  // VS Code asks again right after an accept and may show new ghost text: read the saved file.
  await vscode.press('Control', 'KeyS');
  await waitFor('the saved document', () => fs.readFileSync(file, 'utf8') === expected, { timeoutMs: 10_000 })
    .catch(() => assert.equal(fs.readFileSync(file, 'utf8'), expected));
  await vscode.screenshot(path.join(ensureArtifactsDir(), `${screenshotName}-accepted.png`));
  const commands = await waitFor('draftwise.accepted sent to the server', () => {
    const all = acceptCommands(vscode.tapLog);
    return all.length > acceptedBefore ? all : null;
  }, { timeoutMs: 5000 });
  assert.deepEqual(commands.at(-1), { command: 'draftwise.accepted', arguments: item.command.arguments });
  return { item, expected };
}

describe('VS Code (code-server) with the draftwise extension', { timeout: 900_000 }, () => {
  const model = MODELS.tiny;
  let vscode;
  let workspace;

  before(async () => {
    workspace = makeTempDir('vscode-workspace');
    fs.writeFileSync(path.join(workspace, 'fib.py'), SOURCE);
    fs.writeFileSync(path.join(workspace, 'factorial.py'), REAL_SOURCE);
    vscode = await CodeServer.start({
      workspace,
      logDir: ensureArtifactsDir(),
      name: 'vscode',
      draftwise: { target: model.target(), maxTokens: model.maxTokens, device: 'cpu' },
    });
  });

  after(async () => {
    if (vscode) {
      await vscode.screenshot(path.join(ensureArtifactsDir(), 'vscode-last.png')).catch(() => {});
      await vscode.stop();
    }
  });

  test('the status bar shows the server loading, then ready', { timeout: model.loadTimeoutMs }, async () => {
    const item = await waitFor('Draftwise ready in the status bar', async () => {
      const status = await vscode.statusItem();
      return status && status.icons.includes('codicon-check') ? status : null;
    }, { timeoutMs: model.loadTimeoutMs, intervalMs: 500 }).catch((error) => {
      throw new Error(`${error.message}\nserver log:\n${tail(vscode.serverLog)}\ncode-server log:\n${tail(vscode.log)}`);
    });
    assert.match(item.text, /Draftwise/);
    const progress = readTap(vscode.tapLog).filter(({ message }) => message.method === '$/progress').map(({ message }) => message.params.value.kind);
    assert.equal(progress[0], 'begin');
    assert.equal(progress.at(-1), 'end');
  });

  test('typing shows ghost text from the server, Tab accepts it, and the accept reaches the server', { timeout: model.replyTimeoutMs * 2 }, async () => {
    await typeAndAccept(vscode, path.join(workspace, 'fib.py'), SOURCE, 'fib',
      { replyTimeoutMs: model.replyTimeoutMs, screenshotName: 'vscode-tiny' });
    const status = await waitFor('the last suggestion\'s stats in the status bar', async () => {
      const s = await vscode.statusItem();
      return s && /\d+% · \d+\.\d\d tok\/fwd/.test(s.text) ? s : null;
    }, { timeoutMs: 10_000 });
    assert.match(status.text, /^Draftwise \d+% · \d+\.\d\d tok\/fwd$/);
  });

  test('"Draftwise: Show Stats" shows the server\'s stats', async () => {
    await vscode.press('F1');
    await vscode.page.waitForSelector('.quick-input-widget:not([style*="display: none"]) input', { timeout: 10_000 });
    await vscode.page.keyboard.type('Draftwise: Show Stats', { delay: 10 });
    await waitFor('the command in the palette', () => vscode.page.evaluate(() =>
      [...document.querySelectorAll('.quick-input-list .monaco-list-row')].some((row) => row.textContent.includes('Draftwise: Show Stats'))),
    { timeoutMs: 10_000 });
    await vscode.page.keyboard.press('Enter');
    const text = await waitFor('the stats tab', () => vscode.page.evaluate(() => {
      const tab = document.querySelector('.tab.active');
      const editor = document.querySelector('.editor-group-container.active .editor-instance .view-lines');
      if (!tab || !tab.textContent.includes('stats.json') || !editor) return null;
      return editor.textContent.replace(/\u00a0/g, ' ');
    }), { timeoutMs: 10_000 });
    assert.match(text, /"state": "ready"/);
    assert.match(text, /"device": "cpu"/);
    assert.match(text, /"acceptance_rate": /);
    assert.match(text, /"tokens_per_forward": /);
    await vscode.screenshot(path.join(ensureArtifactsDir(), 'vscode-stats.png'));
    await vscode.press('Control', 'KeyW'); // close the stats tab
  });

  test('changing the target setting reloads the server with Qwen2.5-Coder 0.5B, whose suggestion Tab accepts', {
    skip: !realModelPresent() && 'the qwen2.5-coder-0.5b preset is not pulled (draftwise models pull qwen2.5-coder-0.5b)',
    timeout: MODELS.real.loadTimeoutMs + MODELS.real.replyTimeoutMs * 2,
  }, async () => {
    const real = MODELS.real;
    await waitFor('the extension ready with the first model', async () => (await vscode.statusItem())?.icons.includes('codicon-check'),
      { timeoutMs: model.loadTimeoutMs, intervalMs: 500 });
    const sentBefore = readTap(vscode.tapLog).length;
    await vscode.setSettingInUI('draftwise.maxTokens', real.maxTokens);
    await vscode.setSettingInUI('draftwise.target', real.target());
    await waitFor('workspace/didChangeConfiguration with the new target', () =>
      readTap(vscode.tapLog).slice(sentBefore).some(({ message }) => message.method === 'workspace/didChangeConfiguration'
        && message.params.settings.draftwise.target === real.target()), { timeoutMs: 20_000 });
    await waitFor('Draftwise ready with the 0.5B model', async () => {
      const s = await vscode.statusItem();
      return s && s.icons.includes('codicon-check') && (s.label ?? '').includes(real.target()) ? s : null;
    }, { timeoutMs: real.loadTimeoutMs, intervalMs: 1000 }).catch(async (error) => {
      throw new Error(`${error.message}; status ${JSON.stringify(await vscode.statusItem())}\n${tail(vscode.serverLog)}`);
    });
    const { expected } = await typeAndAccept(vscode, path.join(workspace, 'factorial.py'), REAL_SOURCE, 'n',
      { replyTimeoutMs: real.replyTimeoutMs, screenshotName: 'vscode-real' });
    assert.ok(expected.length > REAL_SOURCE.length + 1);
  });
});
