// A thin client: the draftwise language server builds prompts, runs the models and decides what to
// suggest; this extension starts it, passes settings, lets VS Code show the inline suggestions
// (vscode-languageclient registers the inline completion provider), reports partial accepts, turns
// suggestions on and off, and shows the server's state and the last suggestion's timing.
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { ENABLE_SETTING, Enablement, OffReason, Scope } from './enablement';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  WorkDoneProgress,
  WorkDoneProgressCreateRequest,
} from 'vscode-languageclient/node';

const SECTION = 'draftwise';
const STATS_REQUEST = 'draftwise/stats';
// Where the cursor rests: the server starts the suggestion there (or reads its prompt) before the
// editor asks, so the first request after opening a file or moving to a place finds it under way.
const CURSOR_NOTIFICATION = 'draftwise/cursor';
// How long the cursor must stay put: moving through a file sends nothing.
const CURSOR_REST_MS = 150;
const PARTIALLY_ACCEPTED_COMMAND = 'draftwise.partiallyAccepted';
// Settings that change how the process starts; the rest reach the running server as a notification.
const PROCESS_KEYS = ['server.command', 'server.args', 'server.env', 'languages'];
// Settings only the extension reads (changing them is no news for the server).
const ENABLE_KEY = ENABLE_SETTING;

export interface ServerSettings {
  target: string;
  draft: string | null;
  drafter: string;
  maxTokens: number;
  maxTimeMs: number;
  device: string;
  dtype: string;
  temperature: number;
  contextTokens: number;
  languages: string[] | null; // null: every language
  scope: string;
  alternatives: number;
  repoContext: boolean;
  repoContextTokens: number;
}

export interface ServerStats {
  // idle: no models yet (before the load starts, or between unloading one model and loading the next)
  state: 'idle' | 'loading' | 'ready' | 'failed' | 'unavailable';
  error: string | null;
  target?: string;
  draft?: string | null;
  drafter?: string;
  device?: string;
  dtype?: string;
  weights?: string; // the weight format in use (fp32, bf16, int8, int4)
  last: { acceptance_rate?: number; tokens_per_forward?: number; [key: string]: unknown } | null;
  timing?: { latencyMs: number; tokensPerSecond: number | null; tokens: number } | null;
  cumulative?: Record<string, unknown>;
  requests?: number;
  suggestions?: Record<string, unknown>;
}

export function readSettings(config: vscode.WorkspaceConfiguration): ServerSettings {
  const draft = config.get<string>('draft', '').trim();
  const languages = config.get<string[]>('languages', []);
  return {
    target: config.get<string>('target', 'auto'),
    draft: draft === '' ? null : draft,
    drafter: config.get<string>('drafter', 'auto'),
    maxTokens: config.get<number>('maxTokens', 64),
    maxTimeMs: config.get<number>('maxTimeMs', 150),
    device: config.get<string>('device', 'auto'),
    dtype: config.get<string>('dtype', 'auto'),
    temperature: config.get<number>('temperature', 0),
    contextTokens: config.get<number>('contextTokens', 1536),
    languages: languages.length === 0 ? null : languages,
    scope: config.get<string>('scope', 'auto'),
    alternatives: config.get<number>('alternatives', 3),
    repoContext: config.get<boolean>('repoContext', false),
    repoContextTokens: config.get<number>('repoContextTokens', 512),
  };
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** Where findServerCommand found `command`, in words (for the health report). */
export function serverCommandSource(configured: string, command: string, folders: readonly string[]): string {
  if (configured.trim() !== '') {
    return 'the draftwise.server.command setting';
  }
  return folders.some((folder) => command.startsWith(folder + path.sep)) ? "the workspace's virtual environment" : 'PATH';
}

/** The configured command, else a project virtual environment's draftwise, else draftwise on PATH. */
export function findServerCommand(configured: string, folders: readonly string[]): string | undefined {
  if (configured.trim() !== '') {
    return configured.trim();
  }
  const exe = process.platform === 'win32' ? 'draftwise.exe' : 'draftwise';
  const binDir = process.platform === 'win32' ? 'Scripts' : 'bin';
  for (const folder of folders) {
    for (const venv of ['.venv', 'venv']) {
      const candidate = path.join(folder, venv, binDir, exe);
      if (isExecutable(candidate)) {
        return candidate;
      }
    }
  }
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (dir !== '' && isExecutable(path.join(dir, exe))) {
      return path.join(dir, exe);
    }
  }
  return undefined;
}

function percent(value: unknown): string {
  return typeof value === 'number' ? `${Math.round(value * 100)}%` : '–';
}

function fixed(value: unknown, digits: number): string {
  return typeof value === 'number' ? value.toFixed(digits) : '–';
}

/** "123 ms · 45.6 tok/s" for the last suggestion, or undefined before the first one. */
export function timingText(stats: ServerStats | undefined): string | undefined {
  const timing = stats?.timing;
  if (!timing || typeof timing.latencyMs !== 'number') {
    return undefined;
  }
  const speed = typeof timing.tokensPerSecond === 'number' ? ` · ${timing.tokensPerSecond.toFixed(1)} tok/s` : '';
  return `${Math.round(timing.latencyMs)} ms${speed}`;
}

const OFF_WORDS: Record<OffReason, string> = {
  file: 'off for this file',
  language: 'off for this language',
  everywhere: 'off everywhere',
  snoozed: 'snoozed',
};

class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('draftwise.status', vscode.StatusBarAlignment.Right, 100);
  private phase: 'starting' | 'loading' | 'ready' | 'error' = 'starting';
  private errorMessage = '';
  private lastStats: ServerStats | undefined;
  private generating = 0; // requests in flight
  private off: OffReason | undefined;
  private snoozeMinutes: number | undefined;

  constructor() {
    this.item.name = 'Draftwise';
    this.item.command = 'draftwise.menu';
    this.starting();
    this.item.show();
  }

  private show(text: string, tooltip: string, background?: vscode.ThemeColor): void {
    this.item.text = text;
    this.item.tooltip = tooltip;
    // Screen readers (and the editor tests) read the tooltip's first line.
    this.item.accessibilityInformation = { label: tooltip.split('\n')[0] };
    this.item.backgroundColor = background;
  }

  starting(): void {
    this.progress = {};
    this.phase = 'starting';
    this.render();
  }

  private progress: { message?: string; percentage?: number } = {};

  loading(message: string | undefined, percentage: number | undefined): void {
    // Stats polls carry no progress: keep what the last progress report said.
    message ??= this.progress.message;
    percentage ??= this.progress.percentage;
    this.progress = { message, percentage };
    this.phase = 'loading';
    this.render();
  }

  error(message: string): void {
    this.phase = 'error';
    this.errorMessage = message;
    this.render();
  }

  stats(stats: ServerStats): void {
    if (stats.state === 'failed') {
      this.error(stats.error ?? 'the models failed to load');
      return;
    }
    if (stats.state === 'loading' || stats.state === 'idle') {
      // idle: the models are about to load (a reload unloads the old ones first); not ready yet.
      this.loading(undefined, undefined);
      return;
    }
    this.progress = {};
    this.lastStats = stats;
    this.phase = 'ready';
    this.render();
  }

  /** A suggestion request started (true) or ended (false). */
  request(started: boolean): void {
    this.generating = Math.max(0, this.generating + (started ? 1 : -1));
    this.render();
  }

  enablement(off: OffReason | undefined, snoozeMinutes: number | undefined): void {
    this.off = off;
    this.snoozeMinutes = snoozeMinutes;
    this.render();
  }

  private render(): void {
    if (this.phase === 'starting') {
      this.show('$(loading~spin) Draftwise', 'Draftwise: starting the server');
      return;
    }
    if (this.phase === 'error') {
      this.show('$(error) Draftwise', `Draftwise: ${this.errorMessage}`, new vscode.ThemeColor('statusBarItem.errorBackground'));
      return;
    }
    if (this.phase === 'loading') {
      const { message, percentage } = this.progress;
      const amount = percentage === undefined ? '' : ` ${Math.round(percentage)}%`;
      this.show(`$(loading~spin) Draftwise${amount}`, `Draftwise: loading models${message ? ` (${message})` : ''}`);
      return;
    }
    const stats = this.lastStats;
    const models = `${stats?.target ?? '?'}${stats?.draft ? ` + ${stats.draft}` : ''}`;
    const where = `${stats?.device ?? '?'}, ${stats?.weights ?? '?'} weights, drafter ${stats?.drafter ?? '?'}`;
    if (this.off !== undefined) {
      const words = this.off === 'snoozed' ? `snoozed ${this.snoozeMinutes ?? 0} min` : OFF_WORDS[this.off];
      this.show(`$(${this.off === 'snoozed' ? 'watch' : 'circle-slash'}) Draftwise ${words}`,
        `Draftwise ${words} (the server stays loaded: ${models})\nClick for the menu`);
      return;
    }
    if (this.generating > 0) {
      this.show('$(loading~spin) Draftwise generating…', 'Draftwise: generating a suggestion');
      return;
    }
    const timing = timingText(stats);
    if (stats?.last && timing) {
      const accepted = percent(stats.last.acceptance_rate);
      const perForward = fixed(stats.last.tokens_per_forward, 2);
      this.show(
        `$(check) Draftwise ${timing}`,
        `Draftwise ready: ${models} (${where})\n` +
          `Last suggestion: ${timing}; ${accepted} of drafted tokens accepted, ${perForward} tokens per target forward\n` +
          'Click for the menu',
      );
    } else {
      this.show('$(check) Draftwise', `Draftwise ready: ${models} (${where})\nClick for the menu`);
    }
  }

  dispose(): void {
    this.item.dispose();
  }
}

/** Read-only editor tabs (no save prompt on close): the server's stats as JSON, the health report. */
class StatsDocument implements vscode.TextDocumentContentProvider, vscode.Disposable {
  static readonly scheme = 'draftwise';
  static readonly uri = vscode.Uri.parse(`${StatsDocument.scheme}:stats.json`);
  static readonly healthUri = vscode.Uri.parse(`${StatsDocument.scheme}:health.md`);
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  private readonly registration = vscode.workspace.registerTextDocumentContentProvider(StatsDocument.scheme, this);
  private readonly texts = new Map<string, string>();
  readonly onDidChange = this.changed.event;

  update(stats: ServerStats): void {
    this.set(StatsDocument.uri, JSON.stringify(stats, null, 2) + '\n');
  }

  set(uri: vscode.Uri, text: string): void {
    this.texts.set(uri.toString(), text);
    this.changed.fire(uri);
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.texts.get(uri.toString()) ?? '';
  }

  dispose(): void {
    this.registration.dispose();
    this.changed.dispose();
  }
}

/** The items of the last reply, to tell which one a partial accept took text from. */
interface ShownItems {
  uri: string;
  items: vscode.InlineCompletionItem[];
}

/** Replies kept for partial accepts (DraftwiseClient.shown). */
const SHOWN_REPLIES = 4;

/** Where the editor last asked and got nothing: asked again once the models are loaded. */
interface UnansweredRequest {
  uri: string;
  version: number;
  position: vscode.Position;
}

/** Code points, as the server counts characters. */
function characters(text: string): number {
  return [...text].length;
}

class DraftwiseClient implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private readonly status = new StatusBar();
  readonly enablement = new Enablement(SECTION);
  // The last few replies, newest first: VS Code may keep drawing an item of an earlier reply after a
  // newer one came (it asks again, invoked, at the same cursor, and keeps the item on screen).
  private shown: ShownItems[] = [];
  private serverCommand: { command: string; source: string } | undefined;
  private readonly output = vscode.window.createOutputChannel('Draftwise', { log: true });
  readonly statsDocument = new StatsDocument();
  private pollTimer: NodeJS.Timeout | undefined;
  private refreshTimer: NodeJS.Timeout | undefined;
  lastStats: ServerStats | undefined;
  private documentSelector: vscode.DocumentSelector = [];
  // Whether the server last said its models are ready; its change to true asks again.
  private modelsReady = false;
  private unanswered: UnansweredRequest | undefined;
  private cursorTimer: NodeJS.Timeout | undefined;

  /** The cursor moved (or an editor came to the front): tell the server once it rests there. */
  cursorMoved(editor: vscode.TextEditor | undefined): void {
    clearTimeout(this.cursorTimer);
    if (editor === undefined) {
      return;
    }
    this.cursorTimer = setTimeout(() => this.cursorRested(editor), CURSOR_REST_MS);
  }

  private cursorRested(editor: vscode.TextEditor): void {
    const client = this.client;
    const document = editor.document;
    if (client === undefined || client.state !== State.Running || editor !== vscode.window.activeTextEditor
      || !editor.selection.isEmpty || vscode.languages.match(this.documentSelector, document) === 0
      || this.enablement.offReason(document) !== undefined) {
      return;
    }
    const position = editor.selection.active;
    void client.sendNotification(CURSOR_NOTIFICATION, {
      textDocument: { uri: document.uri.toString() },
      position: { line: position.line, character: position.character },
    });
  }

  async start(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const folders = (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath);
    const command = findServerCommand(config.get<string>('server.command', ''), folders);
    if (command === undefined) {
      const message =
        'draftwise not found: set "draftwise.server.command", or install draftwise into the ' +
        "workspace's .venv or on PATH";
      this.serverCommand = undefined;
      this.status.error(message);
      // Not awaited: activation must not wait for the user to close the message.
      void vscode.window.showErrorMessage(message, 'Open Settings').then((choice) => {
        if (choice === 'Open Settings') {
          void vscode.commands.executeCommand('workbench.action.openSettings', 'draftwise.server');
        }
      });
      return;
    }
    this.serverCommand = { command, source: serverCommandSource(config.get<string>('server.command', ''), command, folders) };
    const args = config.get<string[]>('server.args', ['serve']);
    const env = { ...process.env, ...config.get<Record<string, string>>('server.env', {}) };
    const serverOptions: ServerOptions = {
      command,
      args,
      // No `transport`: TransportKind.stdio would append --stdio, which `draftwise serve` does not take.
      options: { env, cwd: folders[0] },
    };
    const settings = readSettings(config);
    const documentSelector =
      settings.languages === null
        ? [{ scheme: 'file' }, { scheme: 'untitled' }]
        : settings.languages.flatMap((language) => [
            { scheme: 'file', language },
            { scheme: 'untitled', language },
          ]);
    this.documentSelector = documentSelector;
    this.modelsReady = false;
    this.unanswered = undefined;
    const clientOptions: LanguageClientOptions = {
      documentSelector,
      initializationOptions: settings,
      outputChannel: this.output,
      middleware: {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          if (this.enablement.offReason(document) !== undefined) {
            return null; // turned off or snoozed: the server is not asked
          }
          this.status.request(true);
          try {
            const result = await next(document, position, context, token);
            const items = Array.isArray(result) ? result : result?.items ?? [];
            if (items.length > 0) {
              this.shown = [{ uri: document.uri.toString(), items }, ...this.shown].slice(0, SHOWN_REPLIES);
              this.unanswered = undefined;
            } else if (!token.isCancellationRequested) {
              // Nothing (while the models load the server answers so): asked again when they are ready.
              this.unanswered = { uri: document.uri.toString(), version: document.version, position };
            }
            return result;
          } finally {
            this.status.request(false);
            // Stats (and the timing shown) change with every suggestion; read them once it is in.
            this.scheduleStatsRefresh(50);
          }
        },
        executeCommand: async (command, args, next) => {
          const result = await next(command, args);
          this.scheduleStatsRefresh();
          return result;
        },
      },
    };
    this.output.info(`starting ${command} ${args.join(' ')}`);
    this.status.starting();
    const client = new LanguageClient(SECTION, 'Draftwise', serverOptions, clientOptions);
    this.client = client;
    client.onDidChangeState((event) => {
      if (event.newState === State.Stopped && this.client === client) {
        this.status.error('the server stopped (see the Draftwise output)');
      }
    });
    try {
      await client.start();
    } catch (error) {
      this.status.error(`the server did not start: ${String(error)}`);
      return;
    }
    // Replaces the library's progress handler (registered during start, before any server message
    // is read) so that model loading shows in the status bar as well as in the window's progress.
    client.onRequest(WorkDoneProgressCreateRequest.type, (params) => this.trackProgress(client, params.token));
    this.pollUntilSettled();
  }

  private trackProgress(client: LanguageClient, token: string | number): void {
    let finish: () => void = () => undefined;
    let report: (message: string | undefined, increment: number) => void = () => undefined;
    let lastPercentage = 0;
    void vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: 'Draftwise' },
      (progress) =>
        new Promise<void>((resolve) => {
          finish = resolve;
          report = (message, increment) => progress.report({ message, increment });
        }),
    );
    const subscription = client.onProgress(WorkDoneProgress.type, token, (value) => {
      if (value.kind === 'end') {
        subscription.dispose();
        finish();
        // The stats say whether the load ended ready (and then the editor asks again).
        void this.refreshStats();
        return;
      }
      this.modelsReady = false;
      const percentage = value.percentage;
      const increment = percentage === undefined ? 0 : Math.max(0, percentage - lastPercentage);
      lastPercentage = percentage ?? lastPercentage;
      report(value.message, increment);
      this.status.loading(value.message, percentage);
    });
  }

  /** Asks for stats until the models are loaded or failed (covers servers that send no progress). */
  private pollUntilSettled(): void {
    clearTimeout(this.pollTimer);
    const tick = async () => {
      const stats = await this.refreshStats();
      // idle: a reload has unloaded the old models and not yet started on the new ones.
      if (stats === undefined || stats.state === 'loading' || stats.state === 'idle') {
        this.pollTimer = setTimeout(tick, 1500);
      }
    };
    void tick();
  }

  /**
   * The models just became ready: a request that got nothing while they loaded is asked again, so
   * the suggestion shows without another keystroke. Only where the user still is: the same document
   * (unchanged, one the server handles and with suggestions on) and the cursor where it was asked.
   */
  private askAgainAfterLoad(): void {
    const asked = this.unanswered;
    this.unanswered = undefined;
    const editor = vscode.window.activeTextEditor;
    if (asked === undefined || editor === undefined) {
      return;
    }
    const document = editor.document;
    if (document.uri.toString() !== asked.uri || document.version !== asked.version
      || !editor.selection.isEmpty || !editor.selection.active.isEqual(asked.position)) {
      return;
    }
    if (vscode.languages.match(this.documentSelector, document) === 0 || this.enablement.offReason(document) !== undefined) {
      return;
    }
    this.output.info(`models ready: asking again at ${asked.position.line + 1}:${asked.position.character + 1}`);
    void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
  }

  private scheduleStatsRefresh(delayMs = 300): void {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => void this.refreshStats(), delayMs);
  }

  async refreshStats(): Promise<ServerStats | undefined> {
    const client = this.client;
    if (client === undefined || client.state !== State.Running) {
      return undefined;
    }
    try {
      const stats = await client.sendRequest<ServerStats>(STATS_REQUEST, {});
      if (this.client !== client) {
        return undefined; // restarted meanwhile
      }
      this.lastStats = stats;
      this.status.stats(stats);
      const wasReady = this.modelsReady;
      this.modelsReady = stats.state === 'ready';
      if (this.modelsReady && !wasReady) {
        this.askAgainAfterLoad();
      }
      return stats;
    } catch (error) {
      this.output.warn(`${STATS_REQUEST} failed: ${String(error)}`);
      return undefined;
    }
  }

  async showStats(): Promise<void> {
    const stats = await this.refreshStats();
    if (stats === undefined) {
      void vscode.window.showWarningMessage('Draftwise: the server is not running.');
      return;
    }
    this.statsDocument.update(stats);
    const document = await vscode.workspace.openTextDocument(StatsDocument.uri);
    await vscode.languages.setTextDocumentLanguage(document, 'json');
    await vscode.window.showTextDocument(document, { preview: true, preserveFocus: false });
  }

  async onConfigurationChanged(event: vscode.ConfigurationChangeEvent): Promise<void> {
    if (event.affectsConfiguration('editor.inlineSuggest.enabled')) {
      void this.checkInlineSuggest();
    }
    if (!event.affectsConfiguration(SECTION)) {
      return;
    }
    if (event.affectsConfiguration(`${SECTION}.${ENABLE_KEY}`)) {
      this.updateEnablement();
    }
    if (PROCESS_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
      await this.restart();
      return;
    }
    const serverKeys = Object.keys(readSettings(vscode.workspace.getConfiguration(SECTION)));
    if (!serverKeys.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
      return; // only extension settings (enable, trace) changed
    }
    const client = this.client;
    if (client === undefined || client.state !== State.Running) {
      return;
    }
    const settings = readSettings(vscode.workspace.getConfiguration(SECTION));
    await client.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [SECTION]: settings },
    });
    // A new model spec means a reload on the server side.
    this.pollUntilSettled();
  }

  /** The status bar follows the active editor's on/off state. */
  updateEnablement(): void {
    const document = vscode.window.activeTextEditor?.document;
    this.status.enablement(this.enablement.offReason(document), this.enablement.snoozeMinutesLeft());
  }

  async setEnabled(on: boolean, scope: Scope): Promise<void> {
    const document = vscode.window.activeTextEditor?.document;
    if (scope !== 'everywhere' && document === undefined) {
      void vscode.window.showWarningMessage(`Draftwise: open a file to turn suggestions ${on ? 'on' : 'off'} for its ${scope}.`);
      return;
    }
    await this.enablement.set(on, scope, document);
    if (!on) {
      await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
    }
    this.updateEnablement();
  }

  async toggle(scope: Scope): Promise<void> {
    const document = vscode.window.activeTextEditor?.document;
    await this.setEnabled(!this.enablement.isOn(scope, document), scope);
  }

  async snooze(minutes?: number): Promise<void> {
    if (minutes === undefined) {
      const choice = await vscode.window.showQuickPick(['5', '15', '30', '60'].map((m) => ({ label: `${m} minutes`, minutes: Number(m) })),
        { title: 'Draftwise: no suggestions for…' });
      if (choice === undefined) {
        return;
      }
      minutes = choice.minutes;
    }
    this.enablement.snooze(minutes);
    await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
    this.updateEnablement();
  }

  /** The status bar's menu: everything the extension can do, with the current state in the labels. */
  async menu(): Promise<void> {
    const document = vscode.window.activeTextEditor?.document;
    const on = (scope: Scope) => this.enablement.isOn(scope, document);
    const language = document?.languageId ?? 'this language';
    const entries: Array<vscode.QuickPickItem & { run: () => Promise<unknown> | unknown }> = [
      { label: `${on('file') ? 'Disable' : 'Enable'} for this file`, run: () => this.toggle('file') },
      { label: `${on('language') ? 'Disable' : 'Enable'} for ${language}`, run: () => this.toggle('language') },
      { label: `${on('everywhere') ? 'Disable' : 'Enable'} everywhere`, run: () => this.toggle('everywhere') },
      { label: 'Snooze…', run: () => this.snooze() },
      { label: 'Show Stats', run: () => this.showStats() },
      { label: 'Health', run: () => this.health() },
      { label: 'Restart Server', run: () => this.restart() },
    ];
    const picked = await vscode.window.showQuickPick(entries, { title: 'Draftwise' });
    await picked?.run();
  }

  /**
   * Accepts the next word or line of the shown suggestion (VS Code's own commands) and tells the
   * server how much of which item was taken: VS Code reports partial accepts only to extensions
   * using a proposed API, so the extension measures what the command inserted.
   */
  async acceptPart(kind: 'word' | 'line'): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    // Read before accepting: the edit makes VS Code ask again, and the reply joins `shown`.
    const shown = this.shown;
    await vscode.commands.executeCommand(
      kind === 'word' ? 'editor.action.inlineSuggest.acceptNextWord' : 'editor.action.inlineSuggest.acceptNextLine');
    if (editor === undefined) {
      return;
    }
    const cursor = editor.selection.active;
    const uri = editor.document.uri.toString();
    // The taken item is the first, newest reply first, whose text starts with what lies between its
    // start and the cursor now.
    for (const item of shown.filter((reply) => reply.uri === uri).flatMap((reply) => reply.items)) {
      const text = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
      const start = item.range?.start;
      if (start === undefined || cursor.isBeforeOrEqual(start)) {
        continue;
      }
      const taken = editor.document.getText(new vscode.Range(start, cursor));
      if (taken === '' || !text.startsWith(taken)) {
        continue; // not this item
      }
      if (taken === text) {
        return; // all of it: VS Code runs the item's own accept command (an older reply is not looked at)
      }
      const info = item.command?.arguments?.[0];
      if (typeof info?.id !== 'string') {
        return;
      }
      await this.executeServerCommand(PARTIALLY_ACCEPTED_COMMAND, [{ ...info, acceptedLength: characters(taken), kind }]);
      return;
    }
  }

  private async executeServerCommand(command: string, args: unknown[]): Promise<void> {
    const client = this.client;
    if (client === undefined || client.state !== State.Running) {
      return;
    }
    try {
      await client.sendRequest('workspace/executeCommand', { command, arguments: args });
    } catch (error) {
      this.output.warn(`${command} failed: ${String(error)}`);
    }
    this.scheduleStatsRefresh();
  }

  /** Offers to turn VS Code's inline suggestions on when they are off (nothing shows otherwise). */
  async checkInlineSuggest(): Promise<void> {
    if (vscode.workspace.getConfiguration('editor').get<boolean>('inlineSuggest.enabled', true)) {
      return;
    }
    const choice = await vscode.window.showWarningMessage(
      'Draftwise: inline suggestions are turned off in VS Code (editor.inlineSuggest.enabled), so no suggestion can show.',
      'Enable Inline Suggestions');
    if (choice === 'Enable Inline Suggestions') {
      await vscode.workspace.getConfiguration('editor').update('inlineSuggest.enabled', true, vscode.ConfigurationTarget.Global);
    }
  }

  /** A report of what has to be right for suggestions to show, in a read-only tab. */
  async health(): Promise<void> {
    const stats = await this.refreshStats();
    const client = this.client;
    const document = vscode.window.activeTextEditor?.document;
    const inlineSuggest = vscode.workspace.getConfiguration('editor', document).get<boolean>('inlineSuggest.enabled', true);
    const mark = (ok: boolean) => (ok ? 'OK' : 'PROBLEM');
    const lines = ['# Draftwise health', ''];
    const extension = vscode.extensions.getExtension('draftwise.draftwise');
    lines.push(`- extension: ${extension?.packageJSON?.version ?? '?'} in VS Code ${vscode.version}`);
    if (this.serverCommand) {
      lines.push(`- ${mark(true)} server command: ${this.serverCommand.command} (from ${this.serverCommand.source})`);
    } else {
      lines.push(`- ${mark(false)} server command: not found (set draftwise.server.command, or install draftwise into the workspace's .venv or on PATH)`);
    }
    const running = client !== undefined && client.state === State.Running;
    const serverInfo = client?.initializeResult?.serverInfo;
    lines.push(`- ${mark(running)} server: ${running ? `running, ${serverInfo?.name ?? 'draftwise'} ${serverInfo?.version ?? '?'}` : 'not running'}`);
    if (stats) {
      const models = `${stats.target ?? '?'}${stats.draft ? ` + ${stats.draft}` : ''} on ${stats.device ?? '?'} (${stats.dtype ?? '?'}), drafter ${stats.drafter ?? '?'}`;
      const state = stats.state === 'failed' ? `failed: ${stats.error}` : stats.state;
      lines.push(`- ${mark(stats.state !== 'failed')} models: ${state}, ${models}`);
      const timing = timingText(stats);
      if (timing) {
        lines.push(`- last suggestion: ${timing}`);
      }
    }
    lines.push(`- ${mark(inlineSuggest)} editor.inlineSuggest.enabled: ${inlineSuggest}` +
      (inlineSuggest ? '' : ' (VS Code shows no inline suggestion at all; turn it on)'));
    const off = this.enablement.offReason(document);
    lines.push(`- suggestions here: ${off === undefined ? 'on' : off === 'snoozed' ? 'snoozed' : `off (${off})`}`);
    this.statsDocument.set(StatsDocument.healthUri, lines.join('\n') + '\n');
    const healthDocument = await vscode.workspace.openTextDocument(StatsDocument.healthUri);
    await vscode.window.showTextDocument(healthDocument, { preview: true, preserveFocus: false });
    if (!inlineSuggest) {
      void this.checkInlineSuggest();
    }
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async stop(): Promise<void> {
    clearTimeout(this.pollTimer);
    clearTimeout(this.refreshTimer);
    clearTimeout(this.cursorTimer);
    const client = this.client;
    this.client = undefined;
    if (client !== undefined && client.state !== State.Stopped) {
      await client.stop();
    }
  }

  dispose(): void {
    void this.stop();
    this.enablement.dispose();
    this.status.dispose();
    this.output.dispose();
    this.statsDocument.dispose();
  }
}

let draftwise: DraftwiseClient | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const instance = new DraftwiseClient();
  draftwise = instance;
  const scopeOf = (value: unknown): Scope => {
    if (value === undefined) {
      return 'everywhere';
    }
    if (value === 'file' || value === 'language' || value === 'everywhere') {
      return value;
    }
    throw new Error(`Draftwise: scope must be "file", "language" or "everywhere", got ${JSON.stringify(value)}`);
  };
  context.subscriptions.push(
    instance,
    vscode.commands.registerCommand('draftwise.showStats', () => instance.showStats()),
    vscode.commands.registerCommand('draftwise.restartServer', () => instance.restart()),
    vscode.commands.registerCommand('draftwise.menu', () => instance.menu()),
    vscode.commands.registerCommand('draftwise.health', () => instance.health()),
    vscode.commands.registerCommand('draftwise.enable', (scope?: Scope) => instance.setEnabled(true, scopeOf(scope))),
    vscode.commands.registerCommand('draftwise.disable', (scope?: Scope) => instance.setEnabled(false, scopeOf(scope))),
    vscode.commands.registerCommand('draftwise.toggleFile', () => instance.toggle('file')),
    vscode.commands.registerCommand('draftwise.toggleLanguage', () => instance.toggle('language')),
    vscode.commands.registerCommand('draftwise.toggleEverywhere', () => instance.toggle('everywhere')),
    vscode.commands.registerCommand('draftwise.snooze', (minutes?: number) => instance.snooze(minutes)),
    vscode.commands.registerCommand('draftwise.acceptNextWord', () => instance.acceptPart('word')),
    vscode.commands.registerCommand('draftwise.acceptNextLine', () => instance.acceptPart('line')),
    vscode.workspace.onDidChangeConfiguration((event) => instance.onConfigurationChanged(event)),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      instance.updateEnablement();
      instance.cursorMoved(editor);
    }),
    vscode.window.onDidChangeTextEditorSelection((event) => instance.cursorMoved(event.textEditor)),
    instance.enablement.onDidChange(() => instance.updateEnablement()),
  );
  void instance.checkInlineSuggest();
  await instance.start();
  instance.updateEnablement();
  instance.cursorMoved(vscode.window.activeTextEditor);
}

export async function deactivate(): Promise<void> {
  await draftwise?.stop();
  draftwise = undefined;
}
