"""The torch-facing public ops: input checks, then the dispatcher's compiled kernel for the
call, on the current stream. One module per kernel module."""
