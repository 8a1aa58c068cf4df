"""The operator's commands of the server package beyond the database's own (`nf db ...`)."""
