"""The tuning database: SQLAlchemy 2 models, schema migrations, and the operations on them."""
