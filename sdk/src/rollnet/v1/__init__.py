"""Generated protocol code for rollnet.v1 (do not edit: `make codegen` regenerates it)."""
