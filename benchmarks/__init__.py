"""The tf_embed_ops benchmark suite: ``python -m benchmarks`` (see docs/benchmarks.md)."""
