"""Benchmarks (not tests): each file is a script, `python bench/NAME.py --help`;
the workloads are those of ../shared/BENCHMARKS.md (see docs/performance.md)."""
