"""The intercept core: the one owner of every paused request's KV (`core.InterceptCore`), its states and
transitions (`state`), the swap planner (`swap`), the ledger (`meter`) and the records it reports."""
