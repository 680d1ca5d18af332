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
 * - A status-bar item shows the ε this notebook has left. The kernel puts it
 *   in the metadata of every dpmagic output (`metadata.dpmagic`), so the item
 *   reads it from the kernel's messages and from a saved notebook's outputs.
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
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import {
  Compartment,
  EditorState,
  Extension,
  Prec,
  Text
} from '@codemirror/state';
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

    const notes = new WeakMap<NotebookPanel, IBudgetNote | null>();
    const item = new BudgetItem();
    const refresh = (): void => {
      const panel = tracker.currentWidget;
      item.show_(panel ? (notes.get(panel) ?? null) : null);
    };

    tracker.widgetAdded.connect((_, panel) => {
      void panel.context.ready.then(() => {
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
