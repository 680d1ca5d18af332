"""The owner's console: a web page over the gate's ledger and policy (``dpmagic console``).

It shows the datasets and the policy in force, every budget's standing and its
spending over time, the query log with filters, and the renewing budgets; it grants
and resets budgets with a required reason. Every read and every change goes through
``gate/owner.py``, the implementation ``dpmagic budget``/``dpmagic audit`` use, so the
page and the terminal never disagree and the audit log's rows are the same whichever
made them. It never reads a stored answer: owners see what was asked and what it
cost, never what a user was released.

The parts: ``server.py`` serves the pages (tornado) and checks every request;
``owners.py`` says who may (the gate's Unix user by a one-time login URL, an admin
token, a JupyterHub admin: ``hub.py``); ``sessions.py`` keeps the signed-in browsers;
``guards.py`` refuses forged changes; ``hosts.py`` the hosts it answers; ``known.py``
says which users the gate knows, so that a grant to another is asked about first;
one module per page (``overview.py``, ``budgets.py``, ``query_log.py``,
``renewals.py``, ``changes.py``) gathers its text, and its template in
``templates/`` draws it, loaded by ``layout.py`` with escaping on (``charts.py``
computes the charts' geometry).
"""
