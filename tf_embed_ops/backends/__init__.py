"""Table backends: what every front end and lifecycle module asks of a group of tables of one kind.

`protocol.TableGroup` is the interface; `walk` runs one lookup and one update across a list of groups; each kind
implements the protocol in one module: `static` (tables in `tf.Variable`s), `tf_embed_ops.dynamic.engine`
(hash-table tables, in memory or tiered), `tf_embed_ops.tiered.engine` (tables behind a DRAM row cache). Shared by
the kinds: a numbered-row table's checkpoint chain state (`row_chain`) and tracker's view (`touched_rows`), the
serving lookup's base (`served`).
"""
