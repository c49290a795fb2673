// A thin client: the draftwise language server builds prompts, runs the models and decides what to
// suggest; this extension starts it, passes settings, lets VS Code show the inline suggestions
// (vscode-languageclient registers the inline completion provider) and shows the server's state.
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
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
// Settings that change how the process starts; the rest reach the running server as a notification.
const PROCESS_KEYS = ['server.command', 'server.args', 'server.env', 'languages'];

export interface ServerSettings {
  target: string;
  draft: string | null;
  drafter: string;
  maxTokens: number;
  device: string;
  dtype: string;
  temperature: number;
  contextTokens: number;
  languages: string[] | null; // null: every language
  scope: string;
}

export interface ServerStats {
  state: 'loading' | 'ready' | 'failed';
  error: string | null;
  target?: string;
  draft?: string | null;
  drafter?: string;
  device?: string;
  dtype?: string;
  last: { acceptance_rate?: number; tokens_per_forward?: number; [key: string]: unknown } | null;
  cumulative?: Record<string, unknown>;
  requests?: number;
}

export function readSettings(config: vscode.WorkspaceConfiguration): ServerSettings {
  const draft = config.get<string>('draft', '').trim();
  const languages = config.get<string[]>('languages', []);
  return {
    target: config.get<string>('target', 'qwen2.5-coder-0.5b'),
    draft: draft === '' ? null : draft,
    drafter: config.get<string>('drafter', 'auto'),
    maxTokens: config.get<number>('maxTokens', 64),
    device: config.get<string>('device', 'auto'),
    dtype: config.get<string>('dtype', 'auto'),
    temperature: config.get<number>('temperature', 0),
    contextTokens: config.get<number>('contextTokens', 1536),
    languages: languages.length === 0 ? null : languages,
    scope: config.get<string>('scope', 'auto'),
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

class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('draftwise.status', vscode.StatusBarAlignment.Right, 100);

  constructor() {
    this.item.name = 'Draftwise';
    this.item.command = 'draftwise.showStats';
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
    this.show('$(loading~spin) Draftwise', 'Draftwise: starting the server');
  }

  private progress: { message?: string; percentage?: number } = {};

  loading(message: string | undefined, percentage: number | undefined): void {
    // Stats polls carry no progress: keep what the last progress report said.
    message ??= this.progress.message;
    percentage ??= this.progress.percentage;
    this.progress = { message, percentage };
    const amount = percentage === undefined ? '' : ` ${Math.round(percentage)}%`;
    this.show(`$(loading~spin) Draftwise${amount}`, `Draftwise: loading models${message ? ` (${message})` : ''}`);
  }

  error(message: string): void {
    this.show('$(error) Draftwise', `Draftwise: ${message}`, new vscode.ThemeColor('statusBarItem.errorBackground'));
  }

  stats(stats: ServerStats): void {
    if (stats.state === 'failed') {
      this.error(stats.error ?? 'the models failed to load');
      return;
    }
    if (stats.state === 'loading') {
      this.loading(undefined, undefined);
      return;
    }
    this.progress = {};
    const models = `${stats.target ?? '?'}${stats.draft ? ` + ${stats.draft}` : ''}`;
    const where = `${stats.device ?? '?'}, ${stats.dtype ?? '?'}, drafter ${stats.drafter ?? '?'}`;
    if (stats.last) {
      const accepted = percent(stats.last.acceptance_rate);
      const perForward = fixed(stats.last.tokens_per_forward, 2);
      this.show(
        `$(check) Draftwise ${accepted} · ${perForward} tok/fwd`,
        `Draftwise ready: ${models} (${where})\n` +
          `Last suggestion: ${accepted} of drafted tokens accepted, ${perForward} tokens per target forward\n` +
          'Click for full stats',
      );
    } else {
      this.show('$(check) Draftwise', `Draftwise ready: ${models} (${where})\nClick for full stats`);
    }
  }

  dispose(): void {
    this.item.dispose();
  }
}

/** A read-only editor tab with the server's latest stats as JSON (no save prompt on close). */
class StatsDocument implements vscode.TextDocumentContentProvider, vscode.Disposable {
  static readonly scheme = 'draftwise';
  static readonly uri = vscode.Uri.parse(`${StatsDocument.scheme}:stats.json`);
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  private readonly registration = vscode.workspace.registerTextDocumentContentProvider(StatsDocument.scheme, this);
  private text = '{}\n';
  readonly onDidChange = this.changed.event;

  update(stats: ServerStats): void {
    this.text = JSON.stringify(stats, null, 2) + '\n';
    this.changed.fire(StatsDocument.uri);
  }

  provideTextDocumentContent(): string {
    return this.text;
  }

  dispose(): void {
    this.registration.dispose();
    this.changed.dispose();
  }
}

class DraftwiseClient implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private readonly status = new StatusBar();
  private readonly output = vscode.window.createOutputChannel('Draftwise', { log: true });
  readonly statsDocument = new StatsDocument();
  private pollTimer: NodeJS.Timeout | undefined;
  private refreshTimer: NodeJS.Timeout | undefined;
  lastStats: ServerStats | undefined;

  async start(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const folders = (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath);
    const command = findServerCommand(config.get<string>('server.command', ''), folders);
    if (command === undefined) {
      const message =
        'draftwise not found: set "draftwise.server.command", or install draftwise into the ' +
        "workspace's .venv or on PATH";
      this.status.error(message);
      // Not awaited: activation must not wait for the user to close the message.
      void vscode.window.showErrorMessage(message, 'Open Settings').then((choice) => {
        if (choice === 'Open Settings') {
          void vscode.commands.executeCommand('workbench.action.openSettings', 'draftwise.server');
        }
      });
      return;
    }
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
    const clientOptions: LanguageClientOptions = {
      documentSelector,
      initializationOptions: settings,
      outputChannel: this.output,
      middleware: {
        // Stats change with every suggestion; read them once the reply is in.
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          const result = await next(document, position, context, token);
          this.scheduleStatsRefresh();
          return result;
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
        void this.refreshStats();
        return;
      }
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
      if (stats === undefined || stats.state === 'loading') {
        this.pollTimer = setTimeout(tick, 1500);
      }
    };
    void tick();
  }

  private scheduleStatsRefresh(): void {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => void this.refreshStats(), 300);
  }

  async refreshStats(): Promise<ServerStats | undefined> {
    const client = this.client;
    if (client === undefined || client.state !== State.Running) {
      return undefined;
    }
    try {
      const stats = await client.sendRequest<ServerStats>(STATS_REQUEST, {});
      this.lastStats = stats;
      this.status.stats(stats);
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
    if (!event.affectsConfiguration(SECTION)) {
      return;
    }
    if (PROCESS_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
      await this.restart();
      return;
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

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async stop(): Promise<void> {
    clearTimeout(this.pollTimer);
    clearTimeout(this.refreshTimer);
    const client = this.client;
    this.client = undefined;
    if (client !== undefined && client.state !== State.Stopped) {
      await client.stop();
    }
  }

  dispose(): void {
    void this.stop();
    this.status.dispose();
    this.output.dispose();
    this.statsDocument.dispose();
  }
}

let draftwise: DraftwiseClient | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const instance = new DraftwiseClient();
  draftwise = instance;
  context.subscriptions.push(
    instance,
    vscode.commands.registerCommand('draftwise.showStats', () => instance.showStats()),
    vscode.commands.registerCommand('draftwise.restartServer', () => instance.restart()),
    vscode.workspace.onDidChangeConfiguration((event) => instance.onConfigurationChanged(event)),
  );
  await instance.start();
}

export async function deactivate(): Promise<void> {
  await draftwise?.stop();
  draftwise = undefined;
}
