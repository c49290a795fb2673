// VS Code (code-server) with the packaged draftwise extension, driven through headless Chromium.
import chromium from '@sparticuz/chromium';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import {
  binDir,
  cacheDir,
  here,
  makeTempDir,
  repoRoot,
  serverCommand,
  serverEnv,
  spawnLogged,
  stopTree,
  tail,
  tool,
  waitFor,
} from './lib.mjs';

export const VSIX = path.join(cacheDir, 'draftwise.vsix');

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** User settings: the extension's, plus quiet defaults so nothing else takes the focus. */
function userSettings({ draftwise, tapLog, serverLog, holdLoadUntil }) {
  const [command, ...args] = serverCommand(['--log-file', serverLog]);
  const hold = holdLoadUntil ? ['--hold-load-until', holdLoadUntil] : [];
  return {
    'draftwise.server.command': process.execPath,
    'draftwise.server.args': [path.join(here, 'lsp-tap.mjs'), tapLog, ...hold, '--', command, ...args],
    'draftwise.server.env': { PYTHONPATH: serverEnv().PYTHONPATH },
    ...Object.fromEntries(Object.entries(draftwise).map(([key, value]) => [`draftwise.${key}`, value])),
    'editor.inlineSuggest.enabled': true,
    // The inline suggestion toolbar shows "n/m" when there are alternatives.
    'editor.inlineSuggest.showToolbar': 'always',
    'editor.quickSuggestions': { other: false, comments: false, strings: false },
    'editor.suggestOnTriggerCharacters': false,
    'editor.acceptSuggestionOnEnter': 'off',
    // As most people have them: the server's ranges must cover what the editor closed by itself.
    'editor.autoClosingBrackets': 'always',
    'editor.autoClosingQuotes': 'always',
    'editor.minimap.enabled': false,
    'files.autoSave': 'off',
    'chat.disableAIFeatures': true,
    'workbench.secondarySideBar.defaultVisibility': 'hidden',
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'workbench.enableExperiments': false,
    'security.workspace.trust.enabled': false,
    'telemetry.telemetryLevel': 'off',
    'extensions.autoUpdate': false,
    'extensions.autoCheckUpdates': false,
    'update.mode': 'none',
    'git.enabled': false,
  };
}

export class CodeServer {
  /**
   * Installs the .vsix into a fresh profile and starts code-server on a free loopback port.
   * holdLoadUntil: the server's model load waits until this file exists (lsp-tap.mjs --hold-load-until).
   * @param {{workspace: string, draftwise: object, logDir: string, name: string, holdLoadUntil?: string}} options
   */
  static async start({ workspace, draftwise, logDir, name, holdLoadUntil }) {
    if (!fs.existsSync(VSIX)) {
      throw new Error(`${VSIX} is missing: run editor-clients/setup-editors.sh`);
    }
    const cs = new CodeServer();
    cs.home = makeTempDir(`vscode-${name}`);
    cs.workspace = workspace;
    cs.userData = path.join(cs.home, 'user-data');
    cs.extensions = path.join(cs.home, 'extensions');
    cs.log = path.join(logDir, `${name}-code-server.log`);
    cs.serverLog = path.join(logDir, `${name}-server.log`);
    cs.tapLog = path.join(logDir, `${name}-lsp.jsonl`);
    for (const file of [cs.log, cs.serverLog, cs.tapLog]) fs.rmSync(file, { force: true });
    cs.settingsFile = path.join(cs.userData, 'User', 'settings.json');
    cs.machineSettingsFile = path.join(cs.userData, 'Machine', 'settings.json');
    cs.holdLoadUntil = holdLoadUntil;
    cs.writeSettings(draftwise);

    const env = {
      ...process.env,
      PATH: `${binDir}${path.delimiter}${process.env.PATH}`,
      XDG_CONFIG_HOME: path.join(cs.home, 'config'),
      XDG_DATA_HOME: path.join(cs.home, 'data'),
      XDG_CACHE_HOME: path.join(cs.home, 'cache'),
    };
    const codeServer = tool('code-server');
    const profile = ['--user-data-dir', cs.userData, '--extensions-dir', cs.extensions];
    execFileSync(codeServer, [...profile, '--install-extension', VSIX], { env, stdio: 'pipe', timeout: 120_000 });
    cs.port = await freePort();
    fs.writeFileSync(path.join(cs.home, 'config.yaml'), 'auth: none\ncert: false\n');
    cs.process = spawnLogged(codeServer, [
      ...profile,
      '--config', path.join(cs.home, 'config.yaml'),
      '--bind-addr', `127.0.0.1:${cs.port}`,
      '--auth', 'none',
      '--disable-telemetry',
      '--disable-update-check',
      '--disable-workspace-trust',
      '--disable-getting-started-override',
      '--ignore-last-opened',
      workspace,
    ], { env, logFile: cs.log });
    await waitFor('code-server to answer', async () => {
      const response = await fetch(`http://127.0.0.1:${cs.port}/healthz`).catch(() => null);
      return response?.ok;
    }, { timeoutMs: 60_000, intervalMs: 250 }).catch((error) => {
      throw new Error(`${error.message}\n${tail(cs.log)}`);
    });

    cs.browser = await puppeteer.launch({
      executablePath: await chromium.executablePath(),
      args: chromium.args,
      headless: 'shell',
      defaultViewport: { width: 1400, height: 900 },
    });
    cs.page = await cs.browser.newPage();
    await cs.page.goto(`http://127.0.0.1:${cs.port}/?folder=${encodeURIComponent(workspace)}`, { waitUntil: 'domcontentloaded' });
    await cs.page.waitForSelector('.monaco-workbench', { timeout: 60_000 });
    return cs;
  }

  writeSettings(draftwise) {
    const settings = userSettings({ draftwise, tapLog: this.tapLog, serverLog: this.serverLog, holdLoadUntil: this.holdLoadUntil });
    // code-server is a remote window: machine-scoped settings (the server command) are read from
    // the machine's settings, the rest from the user's.
    const machine = Object.fromEntries(Object.entries(settings).filter(([key]) => key.startsWith('draftwise.server.')));
    for (const [file, content] of [[this.settingsFile, settings], [this.machineSettingsFile, machine]]) {
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, `${JSON.stringify(content, null, 2)}\n`);
    }
  }

  userSettings() {
    return JSON.parse(fs.readFileSync(this.settingsFile, 'utf8'));
  }

  /** Runs a command from the Command Palette by its title. */
  async runCommand(title) {
    const page = this.page;
    await this.press('F1');
    await page.waitForSelector('.quick-input-widget:not([style*="display: none"]) input', { timeout: 10_000 });
    await page.keyboard.type(title, { delay: 10 });
    // Clicked by its exact label: Enter would run the first row, which may be a recently used one.
    await this.pick(title, { exact: true });
  }

  /** Picks the row of the open quick pick whose label starts with `label`. */
  async pick(label, { exact = false } = {}) {
    const page = this.page;
    const find = (l, whole) => [...document.querySelectorAll('.quick-input-list .monaco-list-row')].find((row) => {
      const text = (row.querySelector('.label-name') ?? row).textContent.replace(/\u00a0/g, ' ').trim();
      return whole ? text === l : text.startsWith(l);
    });
    await waitFor(`"${label}" in the quick pick`, () => page.evaluate(`(${find})(${JSON.stringify(label)}, ${exact}) !== undefined`),
      { timeoutMs: 10_000 });
    await page.evaluate(`(${find})(${JSON.stringify(label)}, ${exact}).click()`);
  }

  /** Records every text the draftwise status bar item shows from now on (window.draftwiseStatusLog). */
  async recordStatus() {
    await this.page.evaluate(() => {
      window.draftwiseStatusLog = [];
      const item = document.querySelector('.statusbar-item[id$="draftwise.status"]');
      window.draftwiseStatusObserver?.disconnect();
      window.draftwiseStatusObserver = new MutationObserver(() => {
        const text = item.textContent.trim();
        if (window.draftwiseStatusLog.at(-1) !== text) window.draftwiseStatusLog.push(text);
      });
      window.draftwiseStatusObserver.observe(item, { subtree: true, childList: true, characterData: true });
    });
  }

  async statusLog() {
    return this.page.evaluate(() => window.draftwiseStatusLog ?? []);
  }

  /** Clicks the button labelled `label` on a notification whose text includes `text`. */
  async clickNotificationButton(text, label) {
    const page = this.page;
    await waitFor(`a notification "${text}"`, () => page.evaluate((t, l) => {
      const toast = [...document.querySelectorAll('.notification-toast, .notifications-list-container .monaco-list-row')]
        .find((n) => n.textContent.includes(t));
      const button = toast && [...toast.querySelectorAll('.monaco-button')].find((b) => b.textContent.trim() === l);
      if (!button) return false;
      button.click();
      return true;
    }, text, label), { timeoutMs: 15_000 });
  }

  /** Text of the inline suggestion toolbar ("2/3" and its buttons), or null when not shown. */
  async suggestionToolbar() {
    return this.page.evaluate(() => {
      const bar = document.querySelector('.inlineSuggestionsHints');
      return bar ? bar.textContent : null;
    });
  }

  /** Text and accessible label of the draftwise status bar item, or null when it is not shown. */
  async statusItem() {
    return this.page.evaluate(() => {
      // The extension's own item (code-server's window progress is labelled "Draftwise" too).
      const item = document.querySelector('.statusbar-item[id$="draftwise.status"]');
      if (!item) return null;
      const icons = [...item.querySelectorAll('.codicon')].map((icon) =>
        [...icon.classList].find((c) => c.startsWith('codicon-') && c !== 'codicon-modifier-spin'));
      return { text: item.textContent.trim(), label: item.getAttribute('aria-label'), icons };
    });
  }

  /** Opens a workspace file through Quick Open and waits for its editor. */
  async openFile(name, firstLine) {
    const page = this.page;
    await page.keyboard.down('Control');
    await page.keyboard.press('KeyP');
    await page.keyboard.up('Control');
    await page.waitForSelector('.quick-input-widget:not([style*="display: none"]) input', { timeout: 10_000 });
    await page.keyboard.type(name, { delay: 20 });
    await waitFor(`${name} in Quick Open`, () => page.evaluate((n) =>
      [...document.querySelectorAll('.quick-input-list .monaco-list-row')].some((row) => row.textContent.includes(n)), name),
    { timeoutMs: 10_000 });
    await page.keyboard.press('Enter');
    await waitFor(`${name} in an editor`, () => page.evaluate((text) =>
      [...document.querySelectorAll('.editor-instance .view-lines')].some((el) => el.textContent.replace(/\u00a0/g, ' ').includes(text)), firstLine),
    { timeoutMs: 15_000 });
    await page.click('.editor-instance .view-lines');
  }

  /** Changes a user setting the way a person does: the Settings editor, search, type, Tab. */
  async setSettingInUI(key, value) {
    const page = this.page;
    await this.press('Control', 'Comma');
    await page.waitForSelector('.settings-editor', { visible: true, timeout: 15_000 });
    await page.click('.settings-editor .settings-header .suggest-input-container');
    await this.press('Control', 'KeyA');
    await page.keyboard.type(key, { delay: 10 });
    // VS Code titles a setting from its key: draftwise.maxTokens -> "Max Tokens".
    const name = key.split('.').at(-1);
    const label = name[0].toUpperCase() + name.slice(1).replace(/([A-Z])/g, ' $1');
    const input = '.settings-editor .setting-item input.setting-control-focus-target';
    await waitFor(`the ${key} setting alone in the results`, () => page.evaluate((selector, wanted) => {
      const items = document.querySelectorAll('.settings-editor .setting-item');
      return items.length === 1 && items[0].querySelector('.setting-item-label')?.textContent === wanted
        && document.querySelectorAll(selector).length === 1;
    }, input, label), { timeoutMs: 10_000 });
    await page.click(input, { clickCount: 3 });
    await this.press('Control', 'KeyA');
    await page.keyboard.type(String(value), { delay: 10 });
    await page.keyboard.press('Tab');
    // The editor writes the change a moment later; closing it first would drop it.
    // A value equal to the default is saved by removing the key.
    const defaults = JSON.parse(fs.readFileSync(path.join(repoRoot, 'editor-clients', 'vscode', 'package.json'), 'utf8'))
      .contributes.configuration.properties;
    await waitFor(`${key} saved in the user settings`, () => {
      try {
        const saved = JSON.parse(fs.readFileSync(this.settingsFile, 'utf8'))[key] ?? defaults[key]?.default;
        return String(saved) === String(value);
      } catch {
        return false; // being written
      }
    }, { timeoutMs: 10_000 });
    await this.press('Control', 'KeyW');
    await waitFor('the Settings editor to close', () => page.evaluate(() => {
      const editor = document.querySelector('.settings-editor');
      return !editor || editor.offsetParent === null;
    }), { timeoutMs: 10_000 });
  }

  /** Sets a checkbox setting the way a person does (Settings editor, search, click). */
  async setCheckboxSettingInUI(key, value) {
    const page = this.page;
    await this.press('Control', 'Comma');
    await page.waitForSelector('.settings-editor', { visible: true, timeout: 15_000 });
    await page.click('.settings-editor .settings-header .suggest-input-container');
    await this.press('Control', 'KeyA');
    await page.keyboard.type(`@id:${key}`, { delay: 10 });
    const box = '.settings-editor .setting-item .setting-value-checkbox';
    await waitFor(`the ${key} setting alone in the results`, () => page.evaluate((selector) =>
      document.querySelectorAll(selector).length === 1, box), { timeoutMs: 10_000 });
    const saved = () => {
      try {
        return JSON.parse(fs.readFileSync(this.settingsFile, 'utf8'))[key] === value;
      } catch {
        return false; // being written
      }
    };
    // The results list is redrawn while the search settles: click until the change is saved.
    for (let attempt = 0; attempt < 5 && !saved(); attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 500));
      const checked = await page.evaluate((selector) => document.querySelector(selector)?.getAttribute('aria-checked') === 'true', box);
      if (checked !== value) await page.click(box);
      await waitFor(`${key} saved in the user settings`, saved, { timeoutMs: 2000 }).catch(() => null);
    }
    assert.ok(saved(), `${key} was not saved as ${value}`);
    await this.press('Control', 'KeyW');
  }

  async press(...keys) {
    const modifiers = keys.slice(0, -1);
    for (const key of modifiers) await this.page.keyboard.down(key);
    await this.page.keyboard.press(keys.at(-1));
    for (const key of modifiers.reverse()) await this.page.keyboard.up(key);
  }

  /**
   * Ghost text on screen: `inline` is the part drawn on the cursor's line (its token spans joined),
   * `lines` how many ghost elements there are in all (lines below the cursor included); null when none.
   */
  async ghostText() {
    return this.page.evaluate(() => {
      const all = document.querySelectorAll('.ghost-text-decoration, .ghost-text-decoration-preview, .ghost-text');
      if (all.length === 0) return null;
      const inline = [...document.querySelectorAll('.ghost-text-decoration')]
        .map((el) => el.textContent.replace(/\u00a0/g, ' '))
        .join('');
      // The lines after the first: VS Code draws them in a view zone, one .view-line each.
      const lines = [...document.querySelectorAll('.suggest-preview-text .view-line')]
        .map((el) => el.textContent.replace(/\u00a0/g, ' '));
      return { inline, elements: all.length, lines };
    });
  }

  async screenshot(file) {
    await this.page.screenshot({ path: file });
  }

  async stop() {
    await this.browser?.close().catch(() => {});
    await stopTree(this.process, { graceMs: 5000 });
  }
}

/** Text as VS Code draws it in ghost text: control characters as control pictures (U+2400 block). */
export function displayed(text) {
  return [...text]
    .map((ch) => {
      const c = ch.codePointAt(0);
      if (c < 0x20 && ch !== '\t') return String.fromCharCode(0x2400 + c);
      if (c === 0x7f) return '\u2421';
      return ch;
    })
    .join('');
}
