"""The one exception type users catch: every bad input is reported with what is wrong and what to do."""


class DraftVerifyError(ValueError):
    """A request draftverify cannot serve as given (bad argument, incompatible models, unsupported case)."""


class OptionValueError(DraftVerifyError):
    """A method option given a value its drafter cannot take: the caller's to fix, never a reason to leave the
    method out (the bench stops on it instead of skipping the method's rows)."""


def check_number(name: str, value: object, low: float, high: float = float("inf"), *, low_open: bool = False) -> float:
    """Return value as a float if it is a real number in [low, high] ((low, high] when low_open); else raise.

    Used for every user threshold so a wrong type or range names the setting instead of failing inside torch.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise OptionValueError(f"{name} must be a number, got {value!r}")
    below = value <= low if low_open else value < low
    if below or value > high:
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}]" if high != float("inf") else "inf)"
        raise OptionValueError(f"{name} must be in {lo}, {hi}, got {value!r}")
    return float(value)
