"""Every registered method x {greedy, seeded sampling} x every test architecture x every backend that can run it.

Lossless methods give the target's own output: at temperature 0 its greedy text, with a seed the text of our
`autoregressive` method with that seed (coupled sampling makes the draw the target's own, whatever was drafted).
Lossy methods (marked `lossy`, ids `name[lossy]`) are held to what they promise: valid token ids, at most
max_new_tokens, a stop at EOS, the same text for the same seed. The cases come from the registry
(conftest.registered_methods), so a new method is tested with no test edit; one whose needs the suite cannot
build fails (pieces.MissingBuilder). A subject may refuse a method only where refusals are documented (an
encoder-decoder target, a backend other than hf), with a DraftVerifyError before any token: the case is then
skipped with the library's own message."""

from __future__ import annotations

import pytest

from .cases import MODES, cases, check


@pytest.mark.parametrize("name, backend, arch, mode", cases())
def test_the_method_keeps_its_promise(subjects, name, backend, arch, mode):
    check(subjects(backend, arch), name, MODES[mode])
