"""SparseCore (TPU v5p/v6e) host-side semantics on CPU, for `tf_embed_ops.TPUEmbeddingV2`.

* `layout`: how `TPUEmbeddingV2` stacks tables and lays their rows out over SparseCores (TensorFlow's own
  stacker computes the layouts; this module moves values between per-table and stacked form).
* `preprocess`: the host preprocessing of a batch (COO conversion, combiner gains, de-duplication, the per
  SparseCore capacity limits and id dropping) ported from TensorFlow's CPU kernels, in numpy.
* `checkpoint`: checkpoint objects that write and read our per-table variables in the stacked layout.
"""
