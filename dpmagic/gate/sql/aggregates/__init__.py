"""The aggregate catalogue: one module per kind of aggregate the gate releases, each an
``Aggregate`` (``base``) saying how its SQL call is read and how it is planned, and one
table (``registry``) naming the kind of each SQL node type. A node type not in the table
is refused by the check pass. Every pass after the plan asks the kind what differs
between kinds (``base``)."""
