"""Transactions: the transaction coordinator (its state machine without I/O in `state`, the
durable shell that writes `txn` records and sends markers in `coordinator`), and the markers
a partition leader appends for a coordinator (`markers`).

May import main_broker's core modules and the `security`, `objects`, `groups` and `cluster`
sub-packages; never main_broker.broker (the broker is a `markers.TxnHost`).
"""
