"""One revision per change of the schema, chained by down_revision."""
