"""Child process of test_ledger_crash: appends big ledger batches in a loop until killed.

Usage: ``python crash_appender.py URL NODE_ID BATCH_SIZE [HOLD_BATCH]``. Each batch ``n`` has
memos ``batch-<n>:<i>``. After each commit it prints ``committed <n>``. With ``HOLD_BATCH``,
that batch's rows are inserted but, before committing, the child prints ``inserted <n>`` and
waits on stdin forever: the parent kills it there, mid-transaction, deterministically.
"""

from __future__ import annotations

import sys

from rollnet.ledger import EntryKind, NewEntry, append_entries, create_engine, session_factory


def main() -> None:
    url, node_id, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    hold_batch = int(sys.argv[4]) if len(sys.argv) > 4 else None
    sessions = session_factory(create_engine(url))
    batch = 0
    while True:
        batch += 1
        with sessions.begin() as session:
            append_entries(
                session,
                [
                    NewEntry(node_id, EntryKind.CREDIT, 1, memo=f"batch-{batch}:{i}")
                    for i in range(batch_size)
                ],
            )
            session.flush()
            if batch == hold_batch:
                print(f"inserted {batch}", flush=True)
                sys.stdin.read()  # never returns: the parent SIGKILLs us here
        print(f"committed {batch}", flush=True)


if __name__ == "__main__":
    main()
