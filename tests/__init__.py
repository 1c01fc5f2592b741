"""The test suites (a package so worker processes can run ``python -m tests.process...``)."""
