"""Tools for working on llama-forensics from a checkout (run by the tests, ``make`` and CI); not installed."""
