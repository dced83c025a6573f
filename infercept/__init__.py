"""The `infercept` command: the top of the layering (it may import gateway, benchmarks and
engine_adapter; nothing below imports it)."""
