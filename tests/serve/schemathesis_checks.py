"""A check for the schemathesis run of test_openapi_conformance.py (loaded through SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

import json

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance


@schemathesis.check
def valid_data_accepted(ctx, response, case):
    """positive_data_acceptance, save for a prompt over the context window and a constraint the grammar engine
    refuses: how many tokens a text makes is the tokenizer's business, and which regexes, grammars and JSON schemas
    compile the grammar engine's, which a schema cannot state (the 400 says which: code context_length_exceeded,
    invalid_grammar)."""
    if response.status_code == 400:
        try:
            code = json.loads(response.content)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code in ("context_length_exceeded", "invalid_grammar"):
            return None
    return positive_data_acceptance(ctx, response, case)
