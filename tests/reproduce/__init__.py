"""Tests of draftverify.reproduce, one file per module: a package, so test_bita, test_blockwise and test_healing
here are reproduce.test_* apart from tests/drafters/ and tests/ files of the same names."""
