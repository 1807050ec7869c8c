"""pgembed benchmarks: `make bench` (or `python -m bench --help`). Results go to BENCHMARKS.md."""
