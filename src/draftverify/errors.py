"""The one exception type users catch: every bad input is reported with what is wrong and what to do."""


class DraftVerifyError(ValueError):
    """A request draftverify cannot serve as given (bad argument, incompatible models, unsupported case)."""
