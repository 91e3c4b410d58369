"""Stage 5, store: the tuning database. SQLAlchemy 2 models, schema versions and migrations,
export/import, and the operations on them (one transaction per operation). Imports `model`,
`build` (cache keys) and `measure`'s environment record."""
