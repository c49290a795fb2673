// A plain LSP client (vscode-languageserver-protocol over stdio) around a real draftwise server.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  createProtocolConnection,
  ExitNotification,
  InitializedNotification,
  InitializeRequest,
  ShutdownRequest,
  StreamMessageReader,
  StreamMessageWriter,
  WorkDoneProgressCreateRequest,
} from 'vscode-languageserver-protocol/node';
import { serverCommand, serverEnv, sleep } from './lib.mjs';

export class LspSession {
  /**
   * @param {object} options
   * @param {string} options.workspace folder the server runs in (and the workspace folder)
   * @param {object} options.initializationOptions draftwise settings
   * @param {string[]} [options.positionEncodings] what the client offers, most preferred first
   * @param {boolean} [options.workDoneProgress] whether the client announces progress support
   * @param {string} options.logFile the server's stderr goes here
   */
  static async start(options) {
    const session = new LspSession(options);
    await session.initialize();
    return session;
  }

  constructor({ workspace, initializationOptions, positionEncodings = ['utf-16'], workDoneProgress = true, logFile }) {
    this.workspace = workspace;
    this.initializationOptions = initializationOptions;
    this.positionEncodings = positionEncodings;
    this.workDoneProgress = workDoneProgress;
    this.logFile = logFile;
    this.progressCreated = [];
    this.progress = [];
    this.messages = [];
    const [command, ...args] = serverCommand();
    this.process = spawn(command, args, { cwd: workspace, env: serverEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
    this.exited = new Promise((resolve) => this.process.once('exit', (code, signal) => resolve({ code, signal })));
    const log = fs.createWriteStream(logFile, { flags: 'a' });
    this.process.stderr.pipe(log);
    this.connection = createProtocolConnection(
      new StreamMessageReader(this.process.stdout),
      new StreamMessageWriter(this.process.stdin),
    );
    this.connection.onRequest(WorkDoneProgressCreateRequest.type, (params) => {
      this.progressCreated.push(params.token);
      return null;
    });
    this.connection.onUnhandledProgress((params) => this.progress.push(params));
    this.connection.onNotification('window/logMessage', (params) => this.messages.push(params));
    this.connection.onNotification('window/showMessage', (params) => this.messages.push(params));
    this.connection.onRequest('workspace/configuration', (params) =>
      params.items.map((item) => (item.section === 'draftwise' ? this.initializationOptions : null)),
    );
    this.connection.listen();
  }

  async initialize() {
    const rootUri = pathToFileURL(this.workspace).href;
    this.initializeResult = await this.connection.sendRequest(InitializeRequest.type, {
      processId: process.pid,
      clientInfo: { name: 'draftwise-protocol-test', version: '1' },
      rootUri,
      workspaceFolders: [{ uri: rootUri, name: path.basename(this.workspace) }],
      initializationOptions: this.initializationOptions,
      capabilities: {
        general: { positionEncodings: this.positionEncodings },
        window: { workDoneProgress: this.workDoneProgress },
        workspace: { configuration: true, didChangeConfiguration: { dynamicRegistration: false }, workspaceFolders: true },
        textDocument: {
          synchronization: { dynamicRegistration: false, didSave: true },
          inlineCompletion: { dynamicRegistration: false },
        },
      },
    });
    await this.connection.sendNotification(InitializedNotification.type, {});
    return this.initializeResult;
  }

  get capabilities() {
    return this.initializeResult.capabilities;
  }

  stats() {
    return this.connection.sendRequest('draftwise/stats', {});
  }

  /** Polls draftwise/stats until the models are loaded; a failed load ends the wait at once. */
  async waitReady(timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const stats = await this.stats();
      if (stats.state === 'ready') return stats;
      if (stats.state === 'failed') throw new Error(`the server failed to load its models: ${stats.error}`);
      if (Date.now() > deadline) throw new Error(`models still ${stats.state} after ${timeoutMs} ms`);
      await sleep(250);
    }
  }

  open(uri, languageId, text, version = 1) {
    return this.connection.sendNotification('textDocument/didOpen', {
      textDocument: { uri, languageId, version, text },
    });
  }

  change(uri, version, contentChanges) {
    return this.connection.sendNotification('textDocument/didChange', {
      textDocument: { uri, version },
      contentChanges,
    });
  }

  inlineCompletion(uri, position, triggerKind = 2) {
    return this.connection.sendRequest('textDocument/inlineCompletion', {
      textDocument: { uri },
      position,
      context: { triggerKind },
    });
  }

  executeCommand(command, args) {
    return this.connection.sendRequest('workspace/executeCommand', { command, arguments: args });
  }

  changeConfiguration(settings) {
    return this.connection.sendNotification('workspace/didChangeConfiguration', { settings: { draftwise: settings } });
  }

  /** Clean shutdown; resolves with the process's exit code and signal. */
  async shutdown(timeoutMs = 20_000) {
    await this.connection.sendRequest(ShutdownRequest.type);
    await this.connection.sendNotification(ExitNotification.type);
    const timer = new Promise((resolve) => setTimeout(() => resolve(null), timeoutMs));
    const result = await Promise.race([this.exited, timer]);
    this.connection.dispose();
    return result;
  }

  kill() {
    try {
      this.connection.dispose();
    } catch {
      // already closed
    }
    if (this.process.exitCode === null && this.process.signalCode === null) {
      this.process.kill('SIGKILL');
    }
  }
}

/** The items of an inlineCompletion result (array or list form; null means none). */
export function itemsOf(result) {
  if (result === null || result === undefined) return [];
  return Array.isArray(result) ? result : result.items;
}

/** Text of an item's insertText (a string, or a StringValue snippet). */
export function insertTextOf(item) {
  return typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
}
