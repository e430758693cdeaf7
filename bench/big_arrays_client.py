"""A client process of bench.big_arrays: `python -m bench.big_arrays_client SPEC.json`."""

import sys

from bench.big_arrays import client_main

client_main(sys.argv[1])
