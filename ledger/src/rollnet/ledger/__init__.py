"""rollnet coordinator state and the hash-chained contribution ledger."""
