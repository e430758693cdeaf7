"""pvwire load harness and micro-benchmarks (bench/README.md); run on demand: `make bench`."""
