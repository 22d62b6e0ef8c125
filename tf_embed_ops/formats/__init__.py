"""File formats' shared parts: `atomic_write`, the one way every writer of a file or directory another process
reads (checkpoints, deltas, manifests, servables, exports) puts it in place."""
