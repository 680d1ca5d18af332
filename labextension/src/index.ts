/**
 * dpmagic in JupyterLab.
 *
 * Three small things, none of which holds or computes anything private:
 *
 * - `%%dpsql` cells are edited as SQL: every editor gets a CodeMirror
 *   extension that, while its text starts with `%%dpsql`, adds JupyterLab's
 *   own SQL language at the highest precedence, so it wins over the
 *   notebook's Python (which JupyterLab sets, and resets on kernel changes,
 *   through the cell's MIME type; the cell's MIME type is left alone).
 * - Completion is the kernel's: dpmagic registers an IPython completer fed
 *   from the gate's public schema, so it works in every front end; JupyterLab
 *   already shows kernel completions, nothing is added here for it.
 * - A status-bar item shows the ε the current notebook and its user have
 *   left, as the gate states them. The browser cannot reach the gate, so the
 *   item asks the notebook's kernel: a silent execute request (no code, no
 *   execution count, no history, nothing shown in the notebook) whose one
 *   user expression, `dpmagic.budget_status.status()`, asks the gate's
 *   `GET /v1/budget` with the magics' own settings and returns the replies as
 *   JSON under `application/vnd.dpmagic.budget+json`. It asks when a
 *   notebook's kernel is ready (on opening and after a page reload), when the
 *   kernel restarts or changes, when the notebook becomes current, and after
 *   every cell the notebook runs, whatever its outcome (a refused query
 *   charges nothing but may be the first news of budget spent elsewhere).
 *   In a kernel without the dpmagic magics the item is hidden.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  EditorExtensionRegistry,
  IEditorExtensionRegistry,
  IEditorLanguageRegistry
} from '@jupyterlab/codemirror';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import {
  Compartment,
  EditorState,
  Extension,
  Prec,
  Text
} from '@codemirror/state';
import { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

/** The MIME type JupyterLab's language registry maps to SQL. */
const SQL_MIME = 'text/x-sql';
const MAGIC = /^\s*%%dpsql\b/;

/** The kernel-side function that asks the gate (dpmagic/budget_status.py). */
const STATUS_EXPRESSION =
  "__import__('dpmagic.budget_status').budget_status.status()";
/** The MIME type of its answer: the gate's budget replies, as JSON. */
const STATUS_MIME = 'application/vnd.dpmagic.budget+json';
/** Requests the kernel aborted (queued behind a failing cell) are asked again, this often. */
const MAX_RETRIES = 3;
const RETRY_MS = 250;

/** One scope of a `GET /v1/budget` reply: amounts by parameter (`epsilon`, `delta`, …). */
interface IScope {
  spent: Record<string, number>;
  limit: Record<string, number>;
  remaining: Record<string, number>;
}

/** A `GET /v1/budget` reply, as the gate sent it. */
interface IBudget {
  dataset: string;
  user: IScope;
  notebook: IScope;
}

/** What the item shows for one notebook. */
type Status =
  | { state: 'asking' }
  | { state: 'hidden' }
  | {
      state: 'ok';
      notebook: string;
      datasets: string[];
      budgets: IBudget[];
      asked: Date;
    }
  | { state: 'error'; kind: string; message: string; notebook: string };

function isAmounts(value: unknown): value is Record<string, number> {
  return (
    !!value &&
    typeof value === 'object' &&
    typeof (value as Record<string, unknown>).epsilon === 'number'
  );
}

function isScope(value: unknown): value is IScope {
  const scope = value as IScope | null;
  return (
    !!scope &&
    isAmounts(scope.spent) &&
    isAmounts(scope.limit) &&
    isAmounts(scope.remaining)
  );
}

function isBudget(value: unknown): value is IBudget {
  const budget = value as IBudget | null;
  return (
    !!budget &&
    typeof budget.dataset === 'string' &&
    isScope(budget.user) &&
    isScope(budget.notebook)
  );
}

/** The status in a user expression's value, as `budget_status.status()` makes it. */
function readStatus(value: unknown): Status {
  const data = (value as { status?: string; data?: Record<string, unknown> })
    ?.data;
  const payload = data?.[STATUS_MIME] as Record<string, unknown> | undefined;
  if (!payload || typeof payload !== 'object') {
    // No dpmagic in this kernel (not installed, or not an IPython kernel).
    return { state: 'hidden' };
  }
  const notebook = String(payload.notebook ?? '');
  if (payload.state === 'ok') {
    const budgets = Array.isArray(payload.budgets)
      ? payload.budgets.filter(isBudget)
      : [];
    const datasets = Array.isArray(payload.datasets)
      ? payload.datasets.map(String)
      : [];
    if (budgets.length > 0) {
      return { state: 'ok', notebook, datasets, budgets, asked: new Date() };
    }
    return {
      state: 'error',
      kind: 'failed',
      message: 'the gate sent no budget',
      notebook
    };
  }
  if (payload.state === 'error') {
    return {
      state: 'error',
      kind: String(payload.kind ?? 'failed'),
      message: String(payload.message ?? ''),
      notebook
    };
  }
  return { state: 'hidden' };
}

/** Whether an editor's text is a `%%dpsql` cell. */
function isDpsql(doc: Text): boolean {
  return MAGIC.test(doc.sliceString(0, Math.min(doc.length, 200)));
}

/**
 * The extension given to every editor: a compartment holding JupyterLab's SQL
 * support while the text starts with `%%dpsql`, nothing otherwise, switched
 * when an edit adds or removes the magic.
 */
function dpsqlLanguage(sql: Extension, initial: string): Extension {
  const slot = new Compartment();
  const wanted = (isSql: boolean): Extension => (isSql ? Prec.highest(sql) : []);
  const follow = EditorState.transactionExtender.of(tr => {
    const now = isDpsql(tr.newDoc);
    if (!tr.docChanged || now === isDpsql(tr.startState.doc)) {
      return null;
    }
    return { effects: slot.reconfigure(wanted(now)) };
  });
  return [slot.of(wanted(MAGIC.test(initial))), follow];
}

/**
 * What is left, as dpmagic's footers print it (`render.budget_number`): three
 * significant digits, rounded down, so it is never overstated (2.64069 reads
 * 2.64); a float sum's last-bit error is not counted (0.30000000000000004 is 0.3).
 */
function left(value: number, digits = 3): string {
  if (!Number.isFinite(value) || value === 0) {
    return String(value);
  }
  const exact = Number(value.toPrecision(12));
  const exponent = Number(exact.toExponential().split('e')[1]);
  const scale = Math.pow(10, digits - 1 - exponent);
  const steps = Math.floor(Number((exact * scale).toPrecision(12)));
  return String(Number((steps / scale).toPrecision(digits)));
}

/** A limit, a policy's constant, as the footers print it (Python's `:g`). */
function limit(value: number): string {
  return String(Number(value.toPrecision(6)));
}

/** "ε 2.3 of 3", with δ when the limit has one. */
function amount(scope: IScope, parameter: 'epsilon' | 'delta'): string {
  return `${scope.remaining[parameter]} of ${scope.limit[parameter]}`;
}

function exactly(scope: IScope): string {
  let text = `ε ${amount(scope, 'epsilon')}`;
  if (typeof scope.limit.delta === 'number' && scope.limit.delta > 0) {
    text += ` (δ ${amount(scope, 'delta')})`;
  }
  return text;
}

/**
 * The status-bar item: "ε left: notebook 2.3 of 3 · you 9.5 of 10", the
 * notebook's and the user's ε left on the dataset, with every figure as the
 * gate sent it in the tooltip.
 */
class BudgetItem extends Widget {
  constructor() {
    super();
    this.addClass('dpmagic-budget-status');
    this.addClass('jp-StatusBar-TextItem');
  }

  /** Fired when the item should appear or disappear. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  /** Whether there is anything to show (a notebook whose kernel has dpmagic). */
  get active(): boolean {
    return this._active;
  }

  show_(status: Status | null): void {
    const active = !!status && status.state !== 'hidden';
    this.node.dataset.state = status?.state ?? 'hidden';
    if (status?.state === 'asking') {
      this.node.textContent = 'ε left: asking the gate…';
      this.node.title =
        'dpmagic: asking the gate, through this notebook’s kernel, what this notebook and you have left';
    } else if (status?.state === 'error') {
      this.node.textContent =
        status.kind === 'unavailable'
          ? 'ε left: no gate'
          : 'ε left: the gate did not say';
      this.node.title = `dpmagic: the budget could not be asked (${status.kind}): ${status.message}`;
    } else if (status?.state === 'ok') {
      const [first, ...others] = status.budgets;
      const where = status.datasets.length > 1 ? ` on ${first.dataset}` : '';
      const more =
        others.length > 0
          ? ` · +${others.length} dataset${others.length > 1 ? 's' : ''}`
          : '';
      this.node.textContent =
        `ε left${where}: notebook ${left(first.notebook.remaining.epsilon)} of ` +
        `${limit(first.notebook.limit.epsilon)} · you ` +
        `${left(first.user.remaining.epsilon)} of ${limit(first.user.limit.epsilon)}` +
        more;
      const lines = status.budgets.map(
        budget =>
          `dataset ${budget.dataset}: notebook ${status.notebook} has ` +
          `${exactly(budget.notebook)} left; you have ${exactly(budget.user)} left`
      );
      this.node.title =
        `dpmagic, as the gate said at ${status.asked.toLocaleTimeString()}:\n` +
        lines.join('\n');
    }
    if (active !== this._active) {
      this._active = active;
      this._activeStateChanged.emit();
    }
  }

  private _active = false;
  private _activeStateChanged = new Signal<this, void>(this);
}

/**
 * Asks one notebook's kernel for the budget: one request at a time, and one
 * more after it when something asked again meanwhile.
 */
class BudgetAsker {
  constructor(
    readonly panel: NotebookPanel,
    readonly changed: (panel: NotebookPanel) => void
  ) {}

  status: Status | null = null;

  /** Ask now, or as soon as the request in flight has its reply. */
  ask(): void {
    if (this._inFlight) {
      this._again = true;
      return;
    }
    void this._ask();
  }

  /** The kernel is going away or changing: what it said no longer holds. */
  forget(): void {
    if (this.status?.state === 'ok' || this.status?.state === 'error') {
      this._set({ state: 'asking' });
    }
  }

  private async _ask(): Promise<void> {
    this._inFlight = true;
    try {
      let retries = 0;
      do {
        this._again = false;
        const kernel = this.panel.sessionContext.session?.kernel ?? null;
        if (!kernel) {
          this._set({ state: 'hidden' });
          break;
        }
        const outcome = await this._request(kernel);
        if (outcome === 'aborted') {
          // Dropped behind a cell that failed: ask again once the kernel has moved on.
          this._again = retries++ < MAX_RETRIES;
          await new Promise(resolve => setTimeout(resolve, RETRY_MS));
        } else if (outcome) {
          this._set(outcome);
        }
      } while (this._again && !this.panel.isDisposed);
    } finally {
      this._inFlight = false;
    }
  }

  /** The kernel's answer, `aborted` when it dropped the request, null when it failed. */
  private async _request(
    kernel: Kernel.IKernelConnection
  ): Promise<Status | 'aborted' | null> {
    try {
      const future = kernel.requestExecute({
        code: '',
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false,
        user_expressions: { dpmagic_budget: STATUS_EXPRESSION }
      });
      const reply = await future.done;
      const content = reply.content;
      // ipykernel says "aborted"; the protocol's types say "abort".
      const status: string = content.status;
      if (status === 'aborted' || status === 'abort') {
        return 'aborted';
      }
      if (content.status !== 'ok') {
        return { state: 'hidden' };
      }
      return readStatus(content.user_expressions?.dpmagic_budget);
    } catch {
      // The kernel went away before replying: its restart asks again.
      return null;
    }
  }

  private _set(status: Status): void {
    // A busy gate (too many of this user's connections at once) changes nothing shown.
    if (
      status.state === 'error' &&
      status.kind === 'busy' &&
      this.status?.state === 'ok'
    ) {
      return;
    }
    this.status = status;
    this.changed(this.panel);
  }

  private _inFlight = false;
  private _again = false;
}

/** Kernel states after which the kernel must be asked again once it is idle. */
const GONE: ReadonlySet<Kernel.Status> = new Set<Kernel.Status>([
  'unknown',
  'starting',
  'restarting',
  'autorestarting',
  'terminating',
  'dead'
]);

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'dpmagic-jupyterlab:plugin',
  description:
    'SQL editing for %%dpsql cells and the ε left, as the gate states it, in the status bar',
  autoStart: true,
  requires: [INotebookTracker, IEditorExtensionRegistry, IEditorLanguageRegistry],
  optional: [IStatusBar],
  activate: async (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    extensions: IEditorExtensionRegistry,
    languages: IEditorLanguageRegistry,
    statusBar: IStatusBar | null
  ) => {
    // Loaded before any editor asks for it: JupyterLab restores notebooks only
    // once every plugin has activated.
    const sql = (await languages.getLanguage(SQL_MIME))?.support;
    if (sql) {
      extensions.addExtension({
        name: 'dpmagic-jupyterlab:dpsql-language',
        factory: options =>
          EditorExtensionRegistry.createImmutableExtension(
            dpsqlLanguage(sql, options.model.sharedModel.getSource())
          )
      });
    }

    const item = new BudgetItem();
    const askers = new WeakMap<NotebookPanel, BudgetAsker>();
    const refresh = (): void => {
      const panel = tracker.currentWidget;
      item.show_(panel ? (askers.get(panel)?.status ?? null) : null);
    };
    const changed = (panel: NotebookPanel): void => {
      if (panel === tracker.currentWidget) {
        refresh();
      }
    };

    tracker.widgetAdded.connect((_, panel) => {
      const asker = new BudgetAsker(panel, changed);
      askers.set(panel, asker);
      const session = panel.sessionContext;
      // Asked once the kernel is idle after starting, restarting or changing.
      let stale = true;
      session.statusChanged.connect((_, status) => {
        if (GONE.has(status)) {
          if (!stale) {
            stale = true;
            asker.forget();
          }
        } else if (status === 'idle' && stale) {
          stale = false;
          asker.ask();
        }
      });
      session.kernelChanged.connect(() => {
        stale = true;
        asker.forget();
      });
      void session.ready.then(() => {
        if (session.session?.kernel && session.kernelDisplayStatus === 'idle') {
          stale = false;
          asker.ask();
        }
      });
    });

    // After every cell the notebook runs, whatever its outcome.
    NotebookActions.executed.connect((_, { notebook }) => {
      const panel = tracker.find(p => p.content === notebook);
      if (panel) {
        askers.get(panel)?.ask();
      }
    });

    tracker.currentChanged.connect((_, panel) => {
      refresh();
      // Becoming current: the budget may have been spent from another notebook.
      if (panel && panel.sessionContext.session?.kernel) {
        askers.get(panel)?.ask();
      }
    });

    if (statusBar) {
      statusBar.registerStatusItem('dpmagic-jupyterlab:budget', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => tracker.currentWidget !== null && item.active,
        activeStateChanged: item.activeStateChanged
      });
    }
    refresh();
  }
};

export default plugin;
