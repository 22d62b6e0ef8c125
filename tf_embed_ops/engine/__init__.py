"""The parts every front end composes: input normalisation, table variables, lookup and update.

`tf_embed_ops.TPUEmbedding`, `TPUEmbeddingV2`, the Keras layers, the sharded classes (`tf_embed_ops.distribute`)
and the dynamic-table group (`tf_embed_ops.dynamic.engine`) are assembled from these modules instead of each
writing its own copy:

- `inputs`: a nest of ids (and weights) -> `FeatureInput`s in feature order, with TensorFlow's errors;
- `variables`: the table and slot variables, tracked as TensorFlow's CPU classes track them;
- `lookup`: activation shapes and the `output_shape` reshape;
- `update`: gradient checks, the trainability check and the 16-bit rounding step of the fused update;
- `checkpoint`: checkpoint adaptation: a restore is checked whole before any table is written;
- `tiered_restore`, `stacked_tiered_restore`: restores across a table's tiered and in-memory kinds (per table, and
  in `TPUEmbeddingV2`'s stacked layout).

The feature nest itself (its check, key paths and output-shape rule) is `tf_embed_ops.features`; the fused-update
trigger of the Keras layers is `tf_embed_ops.update_trigger`.
"""
