/**
 * dpmagic in JupyterLab.
 *
 * Three small things, none of which holds or computes anything private:
 *
 * - `%%dpsql` cells are edited as SQL: their editor's MIME type is switched
 *   to `text/x-sql` while the cell starts with `%%dpsql`, and switched back
 *   when it no longer does (the notebook resets it on kernel changes, so the
 *   switch is re-applied whenever the MIME type moves).
 * - Completion is the kernel's: dpmagic registers an IPython completer fed
 *   from the gate's public schema, so it works in every front end; JupyterLab
 *   already shows kernel completions, nothing is added here for it.
 * - A status-bar item shows the ε this notebook has left. The kernel puts it
 *   in the metadata of every dpmagic output (`metadata.dpmagic`), so the item
 *   reads it from the kernel's messages and from a saved notebook's outputs.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { KernelMessage } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

/** The MIME type JupyterLab's language registry maps to SQL. */
const SQL_MIME = 'text/x-sql';
const MAGIC = /^\s*%%dpsql\b/;
/** Where the kernel puts the budget in an output's metadata. */
const METADATA_KEY = 'dpmagic';

/** What the kernel publishes after each query: the notebook's ε left. */
interface IBudgetNote {
  notebook: string;
  dataset: string;
  epsilon_left: number;
  epsilon_limit: number;
}

function isBudgetNote(value: unknown): value is IBudgetNote {
  const note = value as IBudgetNote | null;
  return (
    !!note &&
    typeof note.epsilon_left === 'number' &&
    typeof note.epsilon_limit === 'number'
  );
}

/** Keep a code cell's editor in SQL mode exactly while it is a `%%dpsql` cell. */
function followMagic(panel: NotebookPanel, cell: ICellModel): void {
  if (cell.type !== 'code') {
    return;
  }
  const apply = (): void => {
    const isSql = MAGIC.test(cell.sharedModel.getSource());
    if (isSql && cell.mimeType !== SQL_MIME) {
      cell.mimeType = SQL_MIME;
    } else if (!isSql && cell.mimeType === SQL_MIME) {
      cell.mimeType = panel.content.codeMimetype;
    }
  };
  cell.contentChanged.connect(apply);
  cell.mimeTypeChanged.connect(apply);
  apply();
}

function followNotebook(panel: NotebookPanel): void {
  const model = panel.content.model;
  if (!model) {
    return;
  }
  for (const cell of model.cells) {
    followMagic(panel, cell);
  }
  model.cells.changed.connect((_, change) => {
    if (change.type === 'add') {
      for (const cell of change.newValues) {
        followMagic(panel, cell);
      }
    }
  });
}

/** The last budget note among a saved notebook's outputs, if any. */
function savedNote(panel: NotebookPanel): IBudgetNote | null {
  let last: IBudgetNote | null = null;
  for (const cell of panel.content.model?.cells ?? []) {
    const outputs = cell.toJSON().outputs;
    for (const output of Array.isArray(outputs) ? outputs : []) {
      const metadata = (output as { metadata?: Record<string, unknown> })
        .metadata;
      const note = metadata?.[METADATA_KEY];
      if (isBudgetNote(note)) {
        last = note;
      }
    }
  }
  return last;
}

/** The status-bar item: "ε left 2.3 of 3", with the notebook and dataset in its tooltip. */
class BudgetItem extends Widget {
  constructor() {
    super();
    this.addClass('dpmagic-budget-status');
    this.addClass('jp-StatusBar-TextItem');
  }

  show_(note: IBudgetNote | null): void {
    if (!note) {
      this.node.textContent = 'ε left: no query yet';
      this.node.title =
        'dpmagic: the ε this notebook has left shows here after its first %%dpsql query';
      return;
    }
    const left = Number(note.epsilon_left.toPrecision(3));
    const limit = Number(note.epsilon_limit.toPrecision(3));
    this.node.textContent = `ε left: ${left} of ${limit}`;
    this.node.title =
      `dpmagic: notebook ${note.notebook} has ε ${note.epsilon_left} of ` +
      `${note.epsilon_limit} left on dataset ${note.dataset} (after its last query)`;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'dpmagic-jupyterlab:plugin',
  description:
    'SQL editing for %%dpsql cells and the ε left in the status bar',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null
  ) => {
    const notes = new WeakMap<NotebookPanel, IBudgetNote | null>();
    const item = new BudgetItem();
    const refresh = (): void => {
      const panel = tracker.currentWidget;
      item.show_(panel ? (notes.get(panel) ?? null) : null);
    };

    tracker.widgetAdded.connect((_, panel) => {
      void panel.context.ready.then(() => {
        followNotebook(panel);
        notes.set(panel, savedNote(panel));
        refresh();
      });
      panel.sessionContext.iopubMessage.connect((_, message) => {
        if (
          !KernelMessage.isDisplayDataMsg(message) &&
          !KernelMessage.isExecuteResultMsg(message) &&
          !KernelMessage.isUpdateDisplayDataMsg(message)
        ) {
          return;
        }
        const note = (message.content.metadata ?? {})[METADATA_KEY];
        if (isBudgetNote(note)) {
          notes.set(panel, note);
          refresh();
        }
      });
    });
    tracker.currentChanged.connect(refresh);

    if (statusBar) {
      statusBar.registerStatusItem('dpmagic-jupyterlab:budget', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => tracker.currentWidget !== null
      });
    }
    refresh();
  }
};

export default plugin;
