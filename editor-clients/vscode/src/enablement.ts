// Whether suggestions are on for a document: per file (this session), per language and everywhere
// (the `draftwise.enable` setting, keyed by language id like Copilot's `github.copilot.enable`), or
// snoozed for some minutes. None of it restarts the server: the extension just stops asking it.
import * as vscode from 'vscode';

export type Scope = 'file' | 'language' | 'everywhere';
export type OffReason = 'file' | 'language' | 'everywhere' | 'snoozed';

export const ENABLE_SETTING = 'enable';

/** The `draftwise.enable` object: `"*"` for everywhere, language ids for exceptions. */
export function enabledByLanguage(setting: Record<string, boolean> | undefined, languageId: string): OffReason | undefined {
  const table = setting ?? {};
  if (typeof table[languageId] === 'boolean') {
    return table[languageId] ? undefined : 'language';
  }
  return table['*'] === false ? 'everywhere' : undefined;
}

export class Enablement implements vscode.Disposable {
  private readonly offFiles = new Set<string>();
  private snoozedUntil: number | undefined;
  private snoozeTimer: NodeJS.Timeout | undefined;
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChange = this.changed.event;

  constructor(private readonly section: string) {}

  /** Why suggestions are off for `document`, or undefined when they are on. */
  offReason(document: vscode.TextDocument | undefined): OffReason | undefined {
    if (this.snoozedUntil !== undefined) {
      if (Date.now() < this.snoozedUntil) {
        return 'snoozed';
      }
      this.snoozedUntil = undefined;
    }
    const setting = vscode.workspace.getConfiguration(this.section).get<Record<string, boolean>>(ENABLE_SETTING);
    if (document === undefined) {
      return setting?.['*'] === false ? 'everywhere' : undefined;
    }
    if (this.offFiles.has(document.uri.toString())) {
      return 'file';
    }
    return enabledByLanguage(setting, document.languageId);
  }

  snoozeMinutesLeft(): number | undefined {
    return this.snoozedUntil === undefined ? undefined : Math.max(0, Math.ceil((this.snoozedUntil - Date.now()) / 60_000));
  }

  async set(on: boolean, scope: Scope, document: vscode.TextDocument | undefined): Promise<void> {
    if (scope === 'file') {
      if (document === undefined) {
        throw new Error('no active file');
      }
      if (on) {
        this.offFiles.delete(document.uri.toString());
      } else {
        this.offFiles.add(document.uri.toString());
      }
    } else {
      const config = vscode.workspace.getConfiguration(this.section);
      const table = { ...(config.get<Record<string, boolean>>(ENABLE_SETTING) ?? {}) };
      if (scope === 'language') {
        if (document === undefined) {
          throw new Error('no active file');
        }
        if (on && table['*'] !== false) {
          delete table[document.languageId]; // on like the rest: "Disable everywhere" reaches it again
        } else {
          table[document.languageId] = on;
        }
      } else {
        table['*'] = on;
        if (on) {
          this.unsnooze();
        }
      }
      await config.update(ENABLE_SETTING, table, vscode.ConfigurationTarget.Global);
    }
    this.changed.fire();
  }

  isOn(scope: Scope, document: vscode.TextDocument | undefined): boolean {
    if (scope === 'file') {
      return document === undefined || !this.offFiles.has(document.uri.toString());
    }
    const table = vscode.workspace.getConfiguration(this.section).get<Record<string, boolean>>(ENABLE_SETTING) ?? {};
    if (scope === 'language') {
      return document === undefined || table[document.languageId] !== false;
    }
    return table['*'] !== false && this.snoozedUntil === undefined;
  }

  snooze(minutes: number): void {
    if (!Number.isFinite(minutes) || minutes <= 0) {
      throw new Error(`snooze needs a positive number of minutes, got ${minutes}`);
    }
    this.snoozedUntil = Date.now() + minutes * 60_000;
    clearTimeout(this.snoozeTimer);
    this.snoozeTimer = setTimeout(() => {
      this.snoozedUntil = undefined;
      this.changed.fire();
    }, minutes * 60_000);
    this.changed.fire();
  }

  unsnooze(): void {
    clearTimeout(this.snoozeTimer);
    this.snoozedUntil = undefined;
    this.changed.fire();
  }

  dispose(): void {
    clearTimeout(this.snoozeTimer);
    this.changed.dispose();
  }
}
