"""The worker conformance suite's harness: a reference network around a worker program.

The coordinator suite needs nothing but the SDK and lives there (:mod:`rollnet.sdk.conformance`);
the worker suite needs a coordinator, a validator and a model to judge a worker by, so it lives
with them.
"""
