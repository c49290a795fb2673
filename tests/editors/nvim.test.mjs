// Neovim 0.11 with the draftwise plugin against the real server: headless (driven over Neovim's
// RPC) and in a terminal (tmux, real keys, the screen read back).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ensureArtifactsDir, makeTempDir, MODELS, realModelPresent, tail, waitFor } from './lib.mjs';
import { applySuggestion, displayed, HeadlessNvim, TmuxNvim } from './nvim-harness.mjs';

const SOURCE = 'def fibonacci(n):\n    if n < 2:\n        return n\n    return ';

function settingsFor(model) {
  return { target: model.target(), maxTokens: model.maxTokens, device: 'cpu' };
}

function writeSource(name) {
  const dir = makeTempDir(name);
  const file = path.join(dir, 'fib.py');
  fs.writeFileSync(file, SOURCE);
  return file;
}

describe('Neovim headless (tiny model)', { timeout: 600_000 }, () => {
  const model = MODELS.tiny;
  let nvim;
  let file;

  before(async () => {
    file = writeSource('nvim-headless');
    nvim = await HeadlessNvim.start({ file, settings: settingsFor(model), logDir: ensureArtifactsDir(), name: 'nvim-headless' });
  });

  after(async () => {
    await nvim?.stop();
  });

  test('starts the server for the file, loads the models and says so in the statusline', { timeout: model.loadTimeoutMs }, async () => {
    const state = await nvim.waitReady(model.loadTimeoutMs).catch((error) => {
      throw new Error(`${error.message}\nserver log:\n${tail(nvim.serverLog)}`);
    });
    assert.equal(state.native, false, 'Neovim 0.11 uses the plugin\'s own inline client');
    assert.equal(state.client.offset_encoding, 'utf-8', 'Neovim 0.11 negotiates utf-8');
    assert.equal(state.status, 'draftwise: ready');
  });

  test('typing shows the server\'s suggestion as ghost text; Tab accepts it and the server hears it', { timeout: model.replyTimeoutMs }, async () => {
    nvim.send('GA');
    nvim.send('fib');
    const suggestion = await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: model.replyTimeoutMs });
    assert.ok(suggestion.ghost.length > 0);
    const extmarks = nvim.probe('extmarks');
    assert.equal(extmarks.length, 1);
    const [, row, col, details] = extmarks[0];
    assert.deepEqual([row, col], [suggestion.row, suggestion.col]);
    const [firstLine, ...moreLines] = suggestion.ghost.split('\n');
    if (firstLine !== '') {
      assert.equal(details.virt_text[0][0], displayed(firstLine));
      assert.equal(details.virt_text_pos, 'inline');
    }
    assert.deepEqual((details.virt_lines ?? []).map((l) => l[0][0]), moreLines.map(displayed));

    const expected = applySuggestion(nvim.probe('lines'), suggestion);
    const acceptedBefore = nvim.probe('server_stats').suggestions.accepted;
    nvim.send('<Tab>');
    await waitFor('the buffer to hold the accepted suggestion', () =>
      JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected), { timeoutMs: 5000 }).catch(() => {
      assert.deepEqual(nvim.probe('lines'), expected);
    });
    assert.equal(nvim.probe('mode'), 'i');
    const lastLine = expected[expected.length - 1];
    assert.deepEqual(nvim.probe('cursor'), [expected.length, Buffer.byteLength(lastLine)]);
    await waitFor('the server to count the accept', () =>
      nvim.probe('server_stats').suggestions.accepted === acceptedBefore + 1, { timeoutMs: 5000 });
    const state = await waitFor('stats in the statusline', () => {
      const s = nvim.probe('state');
      return /^draftwise: \d+% accepted, \d+\.\d\d tok\/fwd$/.test(s.status) ? s : null;
    }, { timeoutMs: 5000 });
    assert.equal(typeof state.stats.last.tokens_per_forward, 'number');
  });

  test('with nothing shown, Tab falls through to a normal Tab', async () => {
    // Dismiss whatever the last edit brought up, then Tab at once (before the next debounce).
    const [row, col] = nvim.probe('cursor'); // col counts bytes
    const line = Buffer.from(nvim.probe('lines')[row - 1]);
    nvim.send('<C-]><Tab>');
    const now = await waitFor('an indent at the cursor', () => {
      const current = Buffer.from(nvim.probe('lines')[row - 1]);
      return current.equals(line) ? null : current;
    }, { timeoutMs: 5000 });
    const inserted = now.subarray(col, now.length - (line.length - col)).toString();
    assert.match(inserted, /^[ \t]+$/, `Tab inserted ${JSON.stringify(inserted)}`);
    assert.ok(Buffer.concat([now.subarray(0, col), now.subarray(col + inserted.length)]).equals(line));
  });

  test('a reply for a cursor that has moved on is dropped', { timeout: model.replyTimeoutMs }, async () => {
    nvim.send('<Cmd>lua require("draftwise").config.auto_trigger = false<CR>');
    try {
      nvim.send('<Esc>Go    y = fib');
      await waitFor('no suggestion', () => nvim.probe('suggestion') === null, { timeoutMs: 5000 });
      const shown = nvim.probe('server_stats').suggestions.shown;
      // Ask at the end of the line, then move left before the reply can arrive.
      nvim.send('<M-\\><Left>');
      await waitFor('the server to answer', () => nvim.probe('server_stats').suggestions.shown > shown,
        { timeoutMs: model.replyTimeoutMs / 2 });
      await waitFor('the reply to be handled', () => !nvim.probe('pending'), { timeoutMs: 5000 });
      assert.equal(nvim.probe('suggestion'), null);
      assert.deepEqual(nvim.probe('extmarks'), []);
      // Back where the answer was meant for and asked again, it shows.
      nvim.send('<Right><M-\\>');
      await waitFor('a suggestion at the new cursor', () => nvim.probe('suggestion'), { timeoutMs: model.replyTimeoutMs / 2 });
    } finally {
      nvim.send('<Cmd>lua require("draftwise").config.auto_trigger = true<CR>');
    }
  });

  test('accept-line takes a multi-line suggestion up to the end of its first line', { timeout: model.replyTimeoutMs * 2 }, async (t) => {
    // Whole-block suggestions (sent as new settings, as update_settings does) make a multi-line
    // one likely; the tiny model is deterministic, so one of these lines gives one.
    nvim.send('<Cmd>lua require("draftwise").update_settings({ scope = "full", maxTokens = 48 })<CR>');
    const candidates = ['    def push(self, item):', 'import os', '    x = fib', 'for i in range(10):'];
    let suggestion;
    try {
      for (const line of candidates) {
        nvim.send(`<Esc>Go${line}`);
        const shown = await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: 5000 })
          .catch(() => null);
        if (shown && shown.ghost.replace(/^\n/, '').includes('\n')) {
          suggestion = shown;
          t.diagnostic(`multi-line suggestion after ${JSON.stringify(line)}`);
          break;
        }
      }
      assert.ok(suggestion, `none of ${JSON.stringify(candidates)} brought a multi-line suggestion`);
      const lines = nvim.probe('lines');
      const part = suggestion.ghost.slice(0, suggestion.ghost.indexOf('\n', suggestion.ghost.startsWith('\n') ? 1 : 0));
      const before = nvim.probe('server_stats').suggestions;
      nvim.send('<M-l>');
      const expected = applySuggestion(lines, { ...suggestion, start_col: suggestion.col, end_col: suggestion.col, insert: part });
      await waitFor('the accepted line', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
        { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
      const after = await waitFor('the server to count a partial accept', () => {
        const now = nvim.probe('server_stats').suggestions;
        return now.partiallyAccepted === before.partiallyAccepted + 1 ? now : null;
      }, { timeoutMs: 5000 });
      assert.equal(after.acceptedChars - before.acceptedChars, [...part].length);
      assert.equal(after.accepted, before.accepted);
    } finally {
      nvim.send('<Cmd>lua require("draftwise").update_settings({ scope = "auto", maxTokens = 12 })<CR>');
    }
  });

  test(':DraftwiseStats shows the server\'s stats', async () => {
    nvim.send('<Esc>:DraftwiseStats<CR>');
    const buffer = await waitFor('the stats window', () => {
      const b = nvim.probe('buffer');
      return b.lines.some((l) => l.startsWith('state:')) ? b : null;
    }, { timeoutMs: 5000 });
    assert.ok(buffer.lines.includes('state:    ready'), buffer.lines.join('\n'));
    assert.ok(buffer.lines.some((l) => /^requests: [1-9]/.test(l)), buffer.lines.join('\n'));
    assert.ok(buffer.lines.some((l) => l.includes('tokens per target forward')), buffer.lines.join('\n'));
    nvim.send('q');
  });

  test(':checkhealth draftwise finds the server and reports the models ready', async () => {
    nvim.send(':checkhealth draftwise<CR>');
    const buffer = await waitFor('the health report', () => {
      const b = nvim.probe('buffer');
      return b.lines.some((l) => l.includes('models ready')) ? b : null;
    }, { timeoutMs: 10_000 });
    const report = buffer.lines.join('\n');
    assert.match(report, /OK server command: /);
    assert.match(report, /OK server running \(client id \d+, position encoding utf-8\)/);
    assert.doesNotMatch(report, /ERROR/);
  });
});

describe('Neovim in a terminal, typed keys (tiny model)', { timeout: 600_000 }, () => {
  const model = MODELS.tiny;
  let nvim;
  let file;

  before(async () => {
    file = writeSource('nvim-tmux');
    nvim = await TmuxNvim.start({ file, settings: settingsFor(model), logDir: ensureArtifactsDir(), name: 'nvim-tmux' });
  });

  after(async () => {
    await nvim?.stop();
  });

  test('ghost text appears on screen as you type, Tab accepts, :w writes it', { timeout: model.loadTimeoutMs + model.replyTimeoutMs }, async () => {
    await waitFor('"draftwise: ready" on the statusline', () => nvim.screen().includes('draftwise: ready'),
      { timeoutMs: model.loadTimeoutMs, intervalMs: 300 });
    nvim.type('GA');
    nvim.type('fib');
    const suggestion = await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: model.replyTimeoutMs });
    // What the terminal shows: the typed line with the ghost text drawn after the cursor (the
    // screen is 100 columns wide; longer lines are cut there).
    const ghostLines = suggestion.ghost.split('\n');
    const lines = nvim.probe('lines');
    const shownLine = displayed(lines[suggestion.row] + ghostLines[0]).slice(0, 99).trimEnd();
    const screen = await waitFor('the ghost text on screen', () => {
      const text = nvim.screen();
      return text.split('\n').some((l) => l.trimEnd() === shownLine || l.trimEnd().startsWith(shownLine)) ? text : null;
    }, { timeoutMs: 5000 }).catch(() => assert.fail(`screen lacks ${JSON.stringify(shownLine)}:\n${nvim.screen()}`));
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-tmux-ghost.txt'), screen);

    const expected = applySuggestion(lines, suggestion);
    nvim.press('Tab');
    await waitFor('the accepted text in the buffer', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
    nvim.press('Escape');
    nvim.type(':w');
    nvim.press('Enter');
    await waitFor('the file on disk', () => fs.readFileSync(file, 'utf8') === `${expected.join('\n')}\n`, { timeoutMs: 5000 })
      .catch(() => assert.equal(fs.readFileSync(file, 'utf8'), `${expected.join('\n')}\n`));
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-tmux-accepted.txt'), nvim.screen());
  });
});

describe('Neovim with Qwen2.5-Coder 0.5B', { timeout: 900_000 }, () => {
  const model = MODELS.real;
  const skip = !realModelPresent() && 'the qwen2.5-coder-0.5b preset is not pulled (draftwise models pull qwen2.5-coder-0.5b)';
  let nvim;

  after(async () => {
    await nvim?.stop();
  });

  test('a real suggestion appears and Tab accepts it', { skip, timeout: model.loadTimeoutMs + model.replyTimeoutMs }, async () => {
    const file = writeSource('nvim-real');
    nvim = await HeadlessNvim.start({ file, settings: settingsFor(model), logDir: ensureArtifactsDir(), name: 'nvim-real' });
    await nvim.waitReady(model.loadTimeoutMs);
    nvim.send('GA');
    const suggestion = await waitFor('a suggestion from the 0.5B model', () => nvim.probe('suggestion'),
      { timeoutMs: model.replyTimeoutMs, intervalMs: 500 });
    assert.ok(suggestion.ghost.trim().length > 0);
    const expected = applySuggestion(nvim.probe('lines'), suggestion);
    nvim.send('<Tab>');
    await waitFor('the accepted suggestion', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-real-accepted.py'), `${expected.join('\n')}\n`);
  });
});
