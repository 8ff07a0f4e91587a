"""The reference coordinator: leases tasks, takes commitments, settles verdicts, keeps the ledger.

``rollnet coordinator`` runs it (:mod:`rollnet.reference.coordinator.server`). A regular package,
not a namespace one, so that import-linter sees its modules. See ``docs/coordinator.md``.
"""
