"""Synchronous multi-worker training on TensorFlow's collective runtime (docs/collective_training.md).

Under `tf.distribute.MultiWorkerMirroredStrategy`, `te.distribute.fit` trains a Keras model whose
`te.keras.TPUEmbedding` tables are sharded over the workers (row r on worker r % N; a dynamic table's key by its
hash), ids and gradient rows exchanged all-to-all, dense weights mirrored and all-reduced: N workers with batch
B / N train as one process with batch B. The modules, one job each: `layout` (where a row lives), `exchange`
(the collectives and the routing around an all-to-all), `shards` (a layer's shards, and the full tables a
checkpoint holds), `lookup` (the forward half of a step), `update` (the backward half), `loop` (the training loop).
"""
