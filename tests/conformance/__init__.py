"""The conformance suite: a package, so its conftest.py is `conformance.conftest` and leaves tests/conftest.py the
module every other test imports as `conftest`."""
