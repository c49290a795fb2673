// Neovim 0.11 with the draftwise plugin against the real server: headless (driven over Neovim's
// RPC) and in a terminal (tmux, real keys, the screen read back). The tiny model writes random text:
// its tests assert the mechanics (what is drawn and accepted is the server's item). The 0.5B's
// suggestion is also held against `draftwise complete` at the same cursor.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import {
  askedAt, completeFlags, draftwiseComplete, ensureArtifactsDir, loadRetry, makeTempDir, MODELS, realModelPresent, replyItems, tail, waitFor,
  withSuggestion,
} from './lib.mjs';
import { applySuggestion, displayed, HeadlessNvim, TmuxNvim } from './nvim-harness.mjs';

const SOURCE = 'def fibonacci(n):\n    if n < 2:\n        return n\n    return ';
// Where the 0.5B's suggestion is checked against `draftwise complete`: JavaScript, a language no other
// open buffer has, so the server's prompt holds no other file (as `complete`'s holds none). It ends in
// a line break, so Neovim keeps 'eol' and sends the text as written.
const REAL_JS = 'function factorial(n) {\n  if (n <= 1) {\n    return 1;\n  }\n  return \n';

// "draftwise: 123 ms, 45.6 tok/s, 62% accepted": the last suggestion's latency, speed and acceptance.
const TIMING_STATUS = /^draftwise: (\d+) ms, ([\d.]+) tok\/s, \d+% accepted$/;

/** What accept-word takes (the Lua pattern in ghost.lua): blanks, then a word or one run of punctuation. */
function nextWord(ghost) {
  const blank = ghost.match(/^\s*/)[0];
  const rest = ghost.slice(blank.length);
  const word = rest.match(/^[A-Za-z0-9_\u0080-\u{10FFFF}]+/u)?.[0] ?? rest.match(/^[^A-Za-z0-9_\s\u0080-\u{10FFFF}]+/u)?.[0] ?? '';
  return blank + word;
}

function settingsFor(model) {
  return { target: model.target(), maxTokens: model.maxTokens, device: 'cpu' };
}

function writeSource(name) {
  const dir = makeTempDir(name);
  const file = path.join(dir, 'fib.py');
  fs.writeFileSync(file, SOURCE);
  return file;
}

/** A file of its own for a test, next to the one Neovim started with, holding SOURCE; opened in Neovim. */
function openFresh(nvim, startFile, name) {
  return nvim.openFresh(path.join(path.dirname(startFile), name), SOURCE);
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
    // Each keystroke reaches the server at once, so idle work can start before the plugin asks.
    assert.equal(state.client.debounce_text_changes, 0);
    assert.equal(state.status, 'draftwise: ready');
  });

  test('typing shows the server\'s suggestion as ghost text; Tab accepts it and the server hears it', { timeout: model.replyTimeoutMs }, async () => {
    await openFresh(nvim, file, 'typing.py');
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
    const state = await waitFor('the last suggestion\'s timing in the statusline', () => {
      const s = nvim.probe('state');
      return TIMING_STATUS.test(s.status) ? s : null;
    }, { timeoutMs: 5000 });
    const [, ms, speed] = state.status.match(TIMING_STATUS);
    assert.equal(Number(ms), Math.round(state.stats.timing.latencyMs));
    assert.equal(Number(speed), Number(state.stats.timing.tokensPerSecond.toFixed(1)));
  });

  test('typing along a suggestion keeps it on screen (its rest, the same extmark); a character that differs removes it', { timeout: 30_000 }, async () => {
    // A hand-made item (the tiny model's text is arbitrary bytes) shown as a reply would show it;
    // a long debounce leaves time to look before the next request goes out.
    const show = (text) => nvim.lua(`local r, c = unpack(vim.api.nvim_win_get_cursor(0)); require('draftwise.ghost').show_items(0,
      require('draftwise').client(), { { insertText = ${JSON.stringify(text)} } }, r - 1, c, vim.api.nvim_buf_get_changedtick(0))`.replace(/\n\s*/g, ' '));
    await openFresh(nvim, file, 'along.py');
    nvim.lua('require("draftwise").config.debounce_ms = 3000');
    try {
      nvim.send('Gow = ');
      // The line as typed, after any indent Neovim put there.
      const line = await waitFor('the new line', () => {
        const last = nvim.probe('lines').at(-1);
        return last.endsWith('w = ') && !nvim.probe('pending') ? last : null;
      }, { timeoutMs: 5000 });
      show('fib(n - 1)');
      const first = await waitFor('the suggestion', () => nvim.probe('suggestion'), { timeoutMs: 5000 });
      assert.equal(first.ghost, 'fib(n - 1)');
      const [[mark]] = nvim.probe('extmarks');

      nvim.send('fib(');
      const kept = await waitFor('the typed characters', () => (nvim.probe('lines').at(-1) === `${line}fib(` ? nvim.probe('suggestion') : null), { timeoutMs: 5000 });
      assert.equal(kept.ghost, 'n - 1)');
      assert.deepEqual([kept.row, kept.col, kept.insert], [first.row, first.col + 4, 'fib(n - 1)']);
      const marks = nvim.probe('extmarks');
      assert.equal(marks.length, 1);
      assert.deepEqual(marks[0].slice(0, 3), [mark, kept.row, kept.col], 'the same extmark, moved to the cursor');
      assert.equal(marks[0][3].virt_text[0][0], 'n - 1)');
      assert.equal(nvim.probe('pending'), false, 'kept without a reply (the next request waits for the debounce)');

      nvim.send('<Tab>');
      await waitFor('the accepted rest', () => nvim.probe('lines').at(-1) === `${line}fib(n - 1)` ? true : null, { timeoutMs: 5000 })
        .catch(() => assert.equal(nvim.probe('lines').at(-1), `${line}fib(n - 1)`));

      nvim.send(' + ');
      await waitFor('the typed characters', () => nvim.probe('lines').at(-1) === `${line}fib(n - 1) + ` ? true : null, { timeoutMs: 5000 });
      show('fib(n - 2)');
      await waitFor('the next suggestion', () => nvim.probe('suggestion'), { timeoutMs: 5000 });
      nvim.send('n');
      await waitFor('a character that differs to remove it', () => (nvim.probe('extmarks').length === 0 ? true : null), { timeoutMs: 5000 });
      assert.equal(nvim.probe('suggestion'), null);
    } finally {
      nvim.lua('require("draftwise").config.debounce_ms = 100');
    }
  });

  test('with nothing shown, Tab falls through to a normal Tab', async () => {
    await openFresh(nvim, file, 'tab.py');
    nvim.send('GA');
    await waitFor('insert mode', () => nvim.probe('mode') === 'i', { timeoutMs: 5000 });
    // Dismiss whatever entering insert mode brought up, then Tab at once (before the next debounce).
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

  test('the statusline says "generating…" while a request runs, then the latency and speed', { timeout: model.replyTimeoutMs }, async () => {
    await openFresh(nvim, file, 'status.py');
    nvim.lua('_G.draftwise_status_log = {}');
    nvim.send('Go    total = fib');
    await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: model.replyTimeoutMs });
    const log = await waitFor('the statusline after the reply', () => {
      const l = nvim.probe('status_log');
      return TIMING_STATUS.test(l.at(-1)) ? l : null;
    }, { timeoutMs: 5000 });
    const generating = log.indexOf('draftwise: generating…');
    assert.ok(generating >= 0, `statusline texts: ${JSON.stringify(log)}`);
    assert.ok(log.slice(generating + 1).some((text) => TIMING_STATUS.test(text)), JSON.stringify(log));
  });

  test('with show_timing_inline the timing is drawn after the ghost text (off by default)', { timeout: model.replyTimeoutMs }, async () => {
    const chunks = (mark) => [...(mark[3].virt_text ?? []), ...(mark[3].virt_lines ?? []).flat()].map((c) => c[0]);
    await openFresh(nvim, file, 'inline-timing.py');
    nvim.send('Go    y = fib');
    await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: model.replyTimeoutMs });
    assert.ok(!chunks(nvim.probe('extmarks')[0]).some((c) => / \d+ ms/.test(c)), 'no timing unless asked for');
    nvim.lua('require("draftwise").config.show_timing_inline = true');
    try {
      nvim.send('<Esc>Go    value = fib');  // a line the tiny model continues (after some, it ends at once)
      await waitFor('the timing after the ghost text', () => {
        const marks = nvim.probe('extmarks');
        // tok/s only where the engine generated for this answer (not for one idle work had ready)
        return marks.length === 1 && chunks(marks[0]).some((c) => /^ \d+ ms(, [\d.]+ tok\/s)?$/.test(c));
      }, { timeoutMs: model.replyTimeoutMs });
    } finally {
      nvim.lua('require("draftwise").config.show_timing_inline = false');
    }
  });

  test('accept-word (Alt-Right) takes the next word and the server counts a word accept', { timeout: model.replyTimeoutMs * 2 }, async (t) => {
    await openFresh(nvim, file, 'word.py');
    let suggestion;
    for (const line of ['    value = fib', '    def push(self, item):', 'import os', '    x = fib(']) {
      nvim.send(`<Esc>Go${line}`);
      const shown = await waitFor('a suggestion', () => nvim.probe('suggestion'), { timeoutMs: 10_000 }).catch(() => null);
      if (shown && nextWord(shown.ghost) !== shown.ghost && nextWord(shown.ghost).trim() !== '') {
        suggestion = shown;
        t.diagnostic(`suggestion with more than one word after ${JSON.stringify(line)}`);
        break;
      }
    }
    assert.ok(suggestion, 'no suggestion with more than one word');
    const lines = nvim.probe('lines');
    const word = nextWord(suggestion.ghost);
    const before = nvim.probe('server_stats').suggestions;
    nvim.send('<M-Right>');
    const expected = applySuggestion(lines, { ...suggestion, start_col: suggestion.col, end_col: suggestion.col, insert: word });
    await waitFor('the accepted word', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
    const after = await waitFor('the server to count a word accept', () => {
      const now = nvim.probe('server_stats').suggestions;
      return (now.partiallyAcceptedBy.word ?? 0) === (before.partiallyAcceptedBy.word ?? 0) + 1 ? now : null;
    }, { timeoutMs: 5000 });
    assert.equal(after.acceptedChars - before.acceptedChars, [...word].length);
  });

  test('an explicit trigger (Alt-\\) brings alternatives: (n/m) drawn, Alt-] and Alt-[ cycle, Tab takes the one shown', { timeout: model.replyTimeoutMs }, async () => {
    await openFresh(nvim, file, 'alternatives.py');
    nvim.lua('require("draftwise").config.auto_trigger = false');
    try {
      nvim.send('Go    result = fib');
      nvim.send('<M-\\>');
      const first = await waitFor('alternatives', () => {
        const s = nvim.probe('suggestion');
        return s && s.count >= 2 ? s : null;
      }, { timeoutMs: model.replyTimeoutMs });
      assert.equal(first.index, 1);
      const hint = ` (1/${first.count})`;
      const drawn = nvim.probe('extmarks')[0][3];
      assert.ok([...(drawn.virt_text ?? []), ...(drawn.virt_lines ?? []).flat()].some((c) => c[0] === hint),
        `no ${JSON.stringify(hint)} in ${JSON.stringify(drawn)}`);
      nvim.send('<M-]>');
      const second = await waitFor('the second item', () => nvim.probe('suggestion')?.index === 2 && nvim.probe('suggestion'),
        { timeoutMs: 5000 });
      assert.notEqual(second.insert, first.insert);
      nvim.send('<M-[>');
      await waitFor('back at the first item', () => nvim.probe('suggestion')?.index === 1, { timeoutMs: 5000 });
      nvim.send('<M-]>');
      await waitFor('the second item again', () => nvim.probe('suggestion')?.index === 2, { timeoutMs: 5000 });
      const lines = nvim.probe('lines');
      const before = nvim.probe('server_stats').suggestions;
      nvim.send('<Tab>');
      const expected = applySuggestion(lines, second);
      await waitFor('the second item in the buffer', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
        { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
      await waitFor('the server to count an accepted alternative', () =>
        nvim.probe('server_stats').suggestions.alternativesAccepted === before.alternativesAccepted + 1, { timeoutMs: 5000 });
    } finally {
      nvim.lua('require("draftwise").config.auto_trigger = true');
    }
  });

  test(':DraftwiseDisable/Enable per buffer, language and everywhere, and :DraftwiseSnooze, without a server restart', { timeout: 60_000 }, async () => {
    await openFresh(nvim, file, 'toggle.py');
    const clientId = nvim.probe('state').client.id;
    // Typing a line brings a suggestion exactly when suggestions are on.
    const typeLine = async (text) => {
      const shown = nvim.probe('server_stats').suggestions.shown;
      nvim.send(`<Esc>Go${text}`);
      await new Promise((resolve) => setTimeout(resolve, 500)); // debounce (100 ms) and a tiny-model reply
      return { suggestion: nvim.probe('suggestion'), asked: nvim.probe('server_stats').suggestions.shown > shown };
    };
    for (const [scope, status] of [['buffer', 'draftwise: off (buffer)'], ['language', 'draftwise: off (filetype)'],
      ['', 'draftwise: off (everywhere)']]) {
      nvim.send(`<Esc>:DraftwiseDisable ${scope}<CR>`);
      await waitFor(JSON.stringify(status), () => nvim.probe('status') === status, { timeoutMs: 5000 });
      const off = await typeLine('    w = fib');
      assert.deepEqual(off, { suggestion: null, asked: false }, `off for ${scope || 'everywhere'}`);
      nvim.send(`<Esc>:DraftwiseEnable ${scope}<CR>`);
      await waitFor('a suggestion again', async () => (await typeLine('    w = fib')).suggestion, { timeoutMs: 20_000 });
    }
    nvim.send('<Esc>:DraftwiseSnooze 5<CR>');
    await waitFor('"draftwise: snoozed 5 min"', () => nvim.probe('status') === 'draftwise: snoozed 5 min', { timeoutMs: 5000 });
    assert.deepEqual(await typeLine('    v = fib'), { suggestion: null, asked: false });
    nvim.send('<Esc>:DraftwiseEnable<CR>');
    await waitFor('a suggestion after the snooze is lifted', async () => (await typeLine('    v = fib')).suggestion, { timeoutMs: 20_000 });
    nvim.send('<Esc>:DraftwiseDisable sideways<CR>');
    assert.match(nvim.probe('messages'), /scope must be buffer, filetype \(or language\) or global; got "sideways"/);
    assert.equal(nvim.probe('state').client.id, clientId, 'the same server all along');
  });

  test('a reply for a cursor that has moved on is dropped', { timeout: model.replyTimeoutMs }, async () => {
    await openFresh(nvim, file, 'moved.py');
    nvim.send('<Cmd>lua require("draftwise").config.auto_trigger = false<CR>');
    try {
      nvim.send('Go    y = fib');
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
    // one likely. The tiny model's text depends on the whole prompt, other open buffers included
    // (what earlier tests typed and accepted), so try lines that open a block until one brings one.
    await openFresh(nvim, file, 'line.py');
    // No time cap (maxTimeMs 0): on a busy CPU the default 150 ms would end every suggestion at once.
    nvim.send('<Cmd>lua require("draftwise").update_settings({ scope = "full", maxTokens = 48, maxTimeMs = 0 })<CR>');
    const candidates = ['    def push(self, item):', 'import os', '    x = fib', 'for i in range(10):', 'class Stack:',
      'def main():', 'while True:', '    if n < 2:', 'try:', 'with open(path) as f:'];
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
      nvim.send('<Cmd>lua require("draftwise").update_settings({ scope = "auto", maxTokens = 12, maxTimeMs = 150 })<CR>');
    }
  });

  test('where the cursor rests the plugin tells the server (draftwise/cursor), which starts the suggestion there', { timeout: model.replyTimeoutMs }, async () => {
    await openFresh(nvim, file, 'rest.py');
    const before = nvim.probe('server_stats');
    nvim.send('<Esc>G$');
    const after = await waitFor('the server acting on the cursor hint', () => {
      const now = nvim.probe('server_stats');
      return now.readAhead.cursorHints > before.readAhead.cursorHints ? now : null;
    }, { timeoutMs: model.replyTimeoutMs });
    assert.ok(after.idle.prefetches + after.idle.read_aheads > before.idle.prefetches + before.idle.read_aheads);
  });

  test(':DraftwiseStats shows the server\'s stats', async () => {
    nvim.send('<Esc>:DraftwiseStats<CR>');
    const buffer = await waitFor('the stats window', () => {
      const b = nvim.probe('buffer');
      return b.lines.some((l) => l.startsWith('state:')) ? b : null;
    }, { timeoutMs: 5000 });
    assert.ok(buffer.lines.includes('state:    ready'), buffer.lines.join('\n'));
    assert.ok(buffer.lines.some((l) => /^weights:  (fp32|bf16|int8|int4) \(/.test(l)), buffer.lines.join('\n'));
    assert.ok(buffer.lines.some((l) => /^requests: [1-9]/.test(l)), buffer.lines.join('\n'));
    assert.ok(buffer.lines.some((l) => l.includes('tokens per target forward')), buffer.lines.join('\n'));
    nvim.send('q');
  });

  test('a server that dies is restarted, a bounded number of times, with a message', { timeout: model.loadTimeoutMs * 2 }, async () => {
    nvim.send('<Esc>');
    const firstPid = nvim.serverPid();
    assert.ok(firstPid, 'the server process');
    process.kill(firstPid, 'SIGKILL');
    const secondPid = await waitFor('a new server', () => { const pid = nvim.serverPid(); return pid && pid !== firstPid && pid; },
      { timeoutMs: 20_000 });
    assert.match(nvim.probe('messages'), /draftwise: the server exited \(code \d+, signal 9\); restarting it \(1 of 3\)/);
    await waitFor('the new server attached', () => nvim.probe('state').client, { timeoutMs: 20_000 });
    // A server that keeps dying is left alone after `restart.max` restarts within the window.
    nvim.lua('require("draftwise").config.restart = { max = 1, window_s = 60 }');
    process.kill(secondPid, 'SIGKILL');
    await waitFor('the plugin to give up', () => /not restarted: it exited 2 times within 60 s/.test(nvim.probe('messages')),
      { timeoutMs: 10_000 });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    assert.equal(nvim.serverPid(), null, 'no further server');
    assert.equal(nvim.probe('status'), 'draftwise: error');
    // :DraftwiseRestart starts it again, with a fresh count.
    nvim.lua('require("draftwise").config.restart = { max = 3, window_s = 60 }');
    nvim.send(':DraftwiseRestart<CR>');
    await nvim.waitReady(model.loadTimeoutMs);
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
    nvim = await TmuxNvim.start({ file, settings: settingsFor(model), logDir: ensureArtifactsDir(), name: 'nvim-tmux',
      env: { DRAFTWISE_TEST_AUTOCLOSE: '1' } });
  });

  after(async () => {
    await nvim?.stop();
  });

  test('ghost text appears on screen as you type, Tab accepts, :w writes it', { timeout: model.loadTimeoutMs + model.replyTimeoutMs }, async () => {
    await waitFor('"draftwise: ready" on the statusline', () => nvim.screen().includes('draftwise: ready'),
      { timeoutMs: model.loadTimeoutMs, intervalMs: 300 });
    const ghostFile = path.join(path.dirname(file), 'ghost.py');
    await nvim.openFresh(ghostFile, SOURCE);
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
    await waitFor('the file on disk', () => fs.readFileSync(ghostFile, 'utf8') === `${expected.join('\n')}\n`, { timeoutMs: 5000 })
      .catch(() => assert.equal(fs.readFileSync(ghostFile, 'utf8'), `${expected.join('\n')}\n`));
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-tmux-accepted.txt'), nvim.screen());
  });

  test('with an auto-closed bracket, a multi-line suggestion that closes it shows the bracket once', { timeout: 30_000 }, async () => {
    // The server's answer in this case (its range covers the auto-closed ")", its text ends with
    // one); made by hand, because the tiny model's text is random.
    await openFresh(nvim, file, 'bracket.py');
    nvim.send('<Cmd>lua require("draftwise").config.auto_trigger = false<CR>');
    nvim.send('Go<Esc>A'); // a new last line without indent (Esc drops any auto-indent)
    nvim.type('total = add(');
    await waitFor('the auto-closed bracket', () => nvim.probe('lines').at(-1) === 'total = add()', { timeoutMs: 5000 });
    const [row, col] = nvim.probe('cursor');
    assert.equal(col, 'total = add('.length);
    const range = `{ start = { line = ${row - 1}, character = ${col} }, ['end'] = { line = ${row - 1}, character = ${col + 1} } }`;
    nvim.lua(`require('draftwise.ghost').show_items(0, require('draftwise').client(), { { insertText = '1,\\n    2)', range = ${range} } }, ${row - 1}, ${col}, vim.api.nvim_buf_get_changedtick(0))`);
    await waitFor('the suggestion', () => nvim.probe('suggestion'), { timeoutMs: 5000 });
    const screen = await waitFor('the suggestion on screen', () => {
      const text = nvim.screen();
      return text.includes('    2)') ? text : null;
    }, { timeoutMs: 5000 });
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-tmux-bracket.txt'), screen);
    const lines = screen.split('\n').map((l) => l.trimEnd());
    const at = lines.findIndex((l) => l.startsWith('total = add('));
    assert.equal(lines[at], 'total = add(1,', `the ")" shows twice:\n${screen}`);
    assert.equal(lines[at + 1], '    2)');
    nvim.press('Tab');
    await waitFor('the accepted suggestion', () => JSON.stringify(nvim.probe('lines').slice(-2)) === JSON.stringify(['total = add(1,', '    2)']),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines').slice(-2), ['total = add(1,', '    2)']));
  });
});

describe('Neovim with a model load slower than the first request (tiny model)', { timeout: 300_000 }, () => {
  // The server loads its models only once the test lets it (lsp-tap.mjs --hold-load-until), and gets
  // the editor's requests once the load has begun: whatever the CPU, the first request arrives
  // while the models load, and is answered with nothing.
  const model = MODELS.tiny;
  let nvim;
  let file;
  let release;

  before(async () => {
    file = writeSource('nvim-slow-load');
    release = path.join(path.dirname(file), 'release-load');
    const logDir = ensureArtifactsDir();
    nvim = await HeadlessNvim.start({ file, settings: settingsFor(model), logDir, name: 'nvim-slow-load',
      tap: { log: path.join(logDir, 'nvim-slow-load-lsp.jsonl'), holdLoadUntil: release } });
  });

  after(async () => {
    await nvim?.stop();
  });

  test('a request made while the models load gets nothing; once they are loaded the plugin asks again and the suggestion shows, with no further keystroke', {
    timeout: model.loadTimeoutMs + model.replyTimeoutMs,
  }, async () => {
    const uri = pathToFileURL(file).href;
    await waitFor('the server and the plugin attached', () => {
      const attached = nvim.probe('attached');
      return attached.lsp && attached.ghost;
    }, { timeoutMs: 30_000 });
    nvim.send('GA');
    nvim.send('fib');
    const typed = [...SOURCE.split('\n').slice(0, -1), `${SOURCE.split('\n').at(-1)}fib`];
    const cursor = { line: typed.length - 1, character: Buffer.byteLength(typed.at(-1)) }; // utf-8 columns
    await waitFor('the plugin to ask at the cursor', () => askedAt(nvim.tapLog, uri, cursor), { timeoutMs: 20_000 });
    assert.equal(nvim.probe('suggestion'), null);
    fs.writeFileSync(release, ''); // the load begins
    const suggestion = await waitFor('a suggestion after the load', () => nvim.probe('suggestion'),
      { timeoutMs: model.loadTimeoutMs, intervalMs: 250 }).catch((error) => {
      throw new Error(`${error.message}\nserver log:\n${tail(nvim.serverLog)}`);
    });
    assert.deepEqual([suggestion.row, suggestion.col], [cursor.line, cursor.character]);
    assert.deepEqual(nvim.probe('lines'), typed, 'nothing typed since');
    assert.equal(nvim.probe('mode'), 'i');
    const seen = loadRetry(nvim.tapLog, uri, cursor);
    assert.ok(seen.firstReply, 'the first request was answered');
    assert.deepEqual(replyItems(seen.firstReply), [], 'nothing while the models load');
    assert.ok(seen.loadEnd && seen.firstReply.index < seen.loadEnd.index, 'answered before the load ended');
    assert.ok(seen.retry, 'asked again at the same place after the load ended');
    assert.ok(replyItems(seen.retryReply).length > 0, 'the request after the load got a suggestion');
    assert.deepEqual(seen.changes, [], 'no keystroke between the two requests');
  });
});

describe('Neovim 0.12 native path, against a stand-in for vim.lsp.inline_completion', { timeout: 120_000 }, () => {
  // No 0.12 build is installable here: the plugin's native.lua runs on 0.11 against a stand-in that
  // follows the native module's contract (tests/editors/nvim/native_stub.lua says which).
  const model = MODELS.tiny;
  let nvim;
  let file;

  before(async () => {
    file = writeSource('nvim-native');
    nvim = await HeadlessNvim.start({ file, settings: settingsFor(model),
      logDir: ensureArtifactsDir(), name: 'nvim-native', env: { DRAFTWISE_TEST_NATIVE_STUB: '1' } });
    await waitFor('the server attached', () => nvim.probe('state').client, { timeoutMs: 30_000 });
  });

  after(async () => {
    await nvim?.stop();
  });

  /** Puts items in the stand-in for the cursor's position: `range` 'object' (vim.Range), 'list' or none. */
  function show(texts, range = 'object') {
    const [row, col] = nvim.probe('cursor');
    const r = { object: `stub.range(${row - 1}, ${col}, ${row - 1}, ${col})`, list: `{ ${row - 1}, ${col}, ${row - 1}, ${col} }`, none: 'nil' }[range];
    const items = texts.map((t) => `{ client_id = -1, insert_text = ${JSON.stringify(t)}, range = ${r} }`).join(', ');
    nvim.lua(`local stub = vim.lsp.inline_completion; stub._show({ ${items} })`);
  }

  test('the native module is used, and turned on for the buffer', async () => {
    assert.equal(nvim.probe('state').native, true);
    await waitFor('enable(true) for the buffer', () => nvim.probe('native_stub').calls.some((c) => c[0] === 'enable' && c[1] === true),
      { timeoutMs: 10_000 });
  });

  test('Tab after typing along an item inserts it once (Neovim\'s own accept would double the typed text)', async () => {
    await openFresh(nvim, file, 'along.py');
    for (const range of ['object', 'list']) {
      nvim.send('<Esc>Go');
      show(['hello_world()'], range);
      nvim.send('hel<Tab>');
      await waitFor('the accepted item', () => nvim.probe('lines').at(-1) === 'hello_world()', { timeoutMs: 5000 })
        .catch(() => assert.equal(nvim.probe('lines').at(-1), 'hello_world()', `range as ${range}`));
      assert.equal(nvim.probe('native_stub').applied_by_default, 0);
    }
    // The same through the stand-in's own accept: the failure the plugin's accept avoids.
    nvim.send('<Esc>Go');
    show(['hello_world()']);
    nvim.send('hel<Cmd>lua vim.lsp.inline_completion.get()<CR>');
    await waitFor('Neovim\'s accept', () => nvim.probe('native_stub').applied_by_default === 1, { timeoutMs: 5000 });
    assert.equal(nvim.probe('lines').at(-1), 'hello_world()hel');
  });

  test('accept-word and accept-line take part of the item; Alt-] cycles', async () => {
    await openFresh(nvim, file, 'parts.py');
    nvim.send('<Esc>Go');
    show(['foo_bar(baz)\nreturn 1']);
    nvim.send('<M-Right>');
    await waitFor('one word', () => nvim.probe('lines').at(-1) === 'foo_bar', { timeoutMs: 5000 })
      .catch(() => assert.equal(nvim.probe('lines').at(-1), 'foo_bar'));
    nvim.send('<Esc>Go');
    show(['foo_bar(baz)\nreturn 1']);
    nvim.send('<M-l>');
    await waitFor('one line', () => nvim.probe('lines').at(-1) === 'foo_bar(baz)', { timeoutMs: 5000 })
      .catch(() => assert.equal(nvim.probe('lines').at(-1), 'foo_bar(baz)'));
    nvim.send('<Esc>Go');
    show(['first', 'second']);
    nvim.send('<M-]>');
    await waitFor('the second item selected', () => nvim.probe('native_stub').index === 2, { timeoutMs: 5000 });
    nvim.send('<Tab>');
    await waitFor('the second item accepted', () => nvim.probe('lines').at(-1) === 'second', { timeoutMs: 5000 });
  });

  test(':DraftwiseDisable turns the native module off for the buffer, :DraftwiseEnable on', async () => {
    nvim.send('<Esc>:DraftwiseDisable buffer<CR>');
    await waitFor('enable(false)', () => nvim.probe('native_stub').calls.at(-1)[1] === false, { timeoutMs: 5000 });
    nvim.send(':DraftwiseEnable buffer<CR>');
    await waitFor('enable(true)', () => nvim.probe('native_stub').calls.at(-1)[1] === true, { timeoutMs: 5000 });
  });
});

describe('Neovim with Qwen2.5-Coder 0.5B', { timeout: 900_000 }, () => {
  const model = MODELS.real;
  const skip = !realModelPresent() && 'the qwen2.5-coder-0.5b preset is not pulled (draftwise models pull qwen2.5-coder-0.5b)';
  let nvim;
  let file;

  before(async () => {
    if (skip) return;
    file = writeSource('nvim-real');
    // No time cap: the suggestion is compared with `draftwise complete`'s, which has none.
    // The protocol log gives `draftwise complete` the weight format the server chose.
    nvim = await HeadlessNvim.start({ file, settings: { ...settingsFor(model), maxTimeMs: 0 }, logDir: ensureArtifactsDir(), name: 'nvim-real',
      env: { DRAFTWISE_TEST_AUTOCLOSE: '1' }, tap: { log: path.join(ensureArtifactsDir(), 'nvim-real-lsp.jsonl') } });
  });

  after(async () => {
    await nvim?.stop();
  });

  test('a real suggestion appears, Tab accepts it, and it is `draftwise complete`\'s at that cursor', { skip, timeout: model.loadTimeoutMs + model.replyTimeoutMs * 2 }, async () => {
    await nvim.waitReady(model.loadTimeoutMs);
    await nvim.openFresh(path.join(path.dirname(file), 'real.js'), REAL_JS);
    nvim.send('GA');
    const suggestion = await waitFor('a suggestion from the 0.5B model', () => nvim.probe('suggestion'),
      { timeoutMs: model.replyTimeoutMs, intervalMs: 500 });
    assert.ok(suggestion.ghost.trim().length > 0);
    const lines = nvim.probe('lines');
    const expected = applySuggestion(lines, suggestion);
    nvim.send('<Tab>');
    await waitFor('the accepted suggestion', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
    fs.writeFileSync(path.join(ensureArtifactsDir(), 'nvim-real-accepted.js'), `${expected.join('\n')}\n`);
    // What the user got is what the engine writes at that cursor with the same settings, shaped as
    // the server shapes it: the same text, whatever the model's answer is.
    const text = `${lines.join('\n')}\n`;
    const cursor = { line: lines.length - 1, character: lines.at(-1).length };
    const cli = draftwiseComplete('real.js', text, cursor, completeFlags(nvim.tapLog, model));
    assert.ok(cli.suggestion, `draftwise complete has nothing to show here: ${JSON.stringify(cli)}`);
    assert.equal(`${expected.join('\n')}\n`, withSuggestion(text, text.length - 1, cli.suggestion),
      `accepted in Neovim vs draftwise complete (engine text ${JSON.stringify(cli.text)})`);
  });

  // The model may write any call here: this test asserts the mechanics (one closing bracket), not the text.
  test('with auto-closing brackets on, a real suggestion inside print() leaves one closing bracket', { skip, timeout: model.loadTimeoutMs + model.replyTimeoutMs }, async () => {
    await nvim.waitReady(model.loadTimeoutMs);
    await openFresh(nvim, file, 'real-brackets.py');
    nvim.send('Go<Esc>A'); // a new last line without indent (Esc drops any auto-indent)
    nvim.send('print(');
    await waitFor('the auto-closed bracket', () => nvim.probe('lines').at(-1) === 'print()', { timeoutMs: 5000 });
    const suggestion = await waitFor('a suggestion from the 0.5B model', () => nvim.probe('suggestion'),
      { timeoutMs: model.replyTimeoutMs, intervalMs: 500 });
    const expected = applySuggestion(nvim.probe('lines'), suggestion);
    nvim.send('<Tab>');
    await waitFor('the accepted suggestion', () => JSON.stringify(nvim.probe('lines')) === JSON.stringify(expected),
      { timeoutMs: 5000 }).catch(() => assert.deepEqual(nvim.probe('lines'), expected));
    const added = expected.slice(expected.findLastIndex((l) => l.startsWith('print('))).join('\n');
    assert.equal((added.match(/\(/g) ?? []).length, (added.match(/\)/g) ?? []).length, `unbalanced: ${added}`);
  });
});
