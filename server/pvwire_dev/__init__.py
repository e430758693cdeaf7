"""What only development needs: real IOCs as child processes (`ioc`), and the demo IOC with its
images (`demo_ioc`, `demo_images`, `demo/`) that `make run`, the tests and the benchmarks serve.

Provided by the repository's development install (`make venv`: pvwire installed editable from
`server/`), never by pvwire's wheel or the server's image, which serve real IOCs only."""
