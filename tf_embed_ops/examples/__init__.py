"""Runnable end-to-end examples (`python -m tf_embed_ops.examples.ctr`)."""
