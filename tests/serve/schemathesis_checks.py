"""A check for the schemathesis run of test_openapi_conformance.py (loaded through SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

import json

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance


@schemathesis.check
def valid_data_accepted(ctx, response, case):
    """positive_data_acceptance, save for what a schema cannot state, which the 400 names: a prompt over the
    context window (how many tokens a text makes is the tokenizer's business; code context_length_exceeded), a
    constraint the grammar engine refuses (which regexes, grammars and JSON schemas compile is the engine's business;
    code invalid_grammar), and a best_of other than n with stream (param best_of)."""
    if response.status_code == 400:
        try:
            error = json.loads(response.content)["error"]
        except (ValueError, KeyError, TypeError):
            error = {}
        if error.get("code") in ("context_length_exceeded", "invalid_grammar"):
            return None
        body = case.body if isinstance(case.body, dict) else {}
        n = 1 if body.get("n") is None else body["n"]
        if error.get("param") == "best_of" and body.get("best_of") not in (None, n):
            return None
    return positive_data_acceptance(ctx, response, case)
