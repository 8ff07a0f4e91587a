"""rollnet reference servers: coordinator, worker, validator, trainer, relay, environments, CLI."""
