"""Dynamic-vocabulary embedding tables: hash-keyed tables that grow (docs/dynamic_tables.md)."""
