"""What the libraries under draftverify may print: nothing of their own by default, everything when asked.

transformers 5 draws a "Loading weights" progress bar for every model it loads and logs advice meant for its own
users (generation flags, tokenizer lengths); from draftverify's API or CLI that is noise on stderr, and it garbles
piped or --json output. One mechanism keeps it quiet for both:

- `quiet_libraries()` turns transformers' (and huggingface_hub's) progress bars off, its log level to errors and
  its Python warnings off, and returns a function that puts back exactly what was there before. The CLI calls it
  once for the whole process (`quiet_process()`); the library (`load`, `load_model`, `load_tokenizer`, the bench)
  through `quiet()`, only while it loads, so the user's own settings hold again afterwards.
- A level the user chose wins: with TRANSFORMERS_VERBOSITY set, or a verbosity set in code (anything but
  transformers' default, warning), the log level is left alone.
- `verbose=True` (API) or DRAFTVERIFY_VERBOSE=1 (API and CLI) leaves everything as transformers has it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Iterator

VERBOSE_ENV = "DRAFTVERIFY_VERBOSE"


def verbose_requested(verbose: bool | None = None) -> bool:
    """verbose if given, else whether DRAFTVERIFY_VERBOSE is set to something other than 0 / false / no / empty."""
    if verbose is not None:
        return bool(verbose)
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def quiet_libraries(process: bool = False) -> Callable[[], None]:
    """Silence transformers' progress bars, warnings and logs below error; return restore(), which undoes exactly
    that. process=True (the CLI, which owns its process) also sets TRANSFORMERS_VERBOSITY=error when the user has
    not set it, for messages logged while transformers' modules are imported later."""
    user_level = os.environ.get("TRANSFORMERS_VERBOSITY")
    if process and not user_level:
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"  # read when transformers first configures its logger
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # transformers' own bars and huggingface_hub's (downloads)
    if not user_level and level == hf_logging.WARNING:  # transformers' default: the user chose nothing
        hf_logging.set_verbosity_error()
    filters = warnings.catch_warnings()
    filters.__enter__()
    warnings.filterwarnings("ignore", module=r"transformers(\.|$)")

    def restore() -> None:
        filters.__exit__(None, None, None)
        if hf_logging.get_verbosity() != level:
            hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_utils.are_progress_bars_disabled() != hub_bars_off:
            (hub_utils.disable_progress_bars if hub_bars_off else hub_utils.enable_progress_bars)()

    return restore


def quiet_process() -> None:
    """The CLI's call, once for the whole process: transformers' own output (weight-loading progress bars, which
    would garble --json output; warnings such as a long prompt against the tokenizer's nominal maximum) is noise to
    a CLI user, whose checks report what matters. A TRANSFORMERS_VERBOSITY the user set wins, and
    DRAFTVERIFY_VERBOSE=1 shows everything."""
    if not verbose_requested():
        quiet_libraries(process=True)


@contextlib.contextmanager
def quiet(verbose: bool | None = None) -> Iterator[None]:
    """Within the block, transformers prints nothing of its own (unless verbose / DRAFTVERIFY_VERBOSE)."""
    if verbose_requested(verbose):
        yield
        return
    restore = quiet_libraries()
    try:
        yield
    finally:
        restore()
