"""Benchmarks of parallel_mcp (not tests): ``python -m bench.run``; see bench/README.md."""
