"""The reference trainer: asynchronous GRPO on rollouts from an untrusted swarm.

See docs/trainer.md. :mod:`~rollnet.reference.trainer.loss` holds the loss options,
:mod:`~rollnet.reference.trainer.advantages` the group advantages and
:mod:`~rollnet.reference.trainer.intake` the path from the rollout stream to a batch.
"""
