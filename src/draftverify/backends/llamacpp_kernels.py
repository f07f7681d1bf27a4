"""Whether the llama.cpp library in use scores a verify pass's tokens bit for bit as one-token decoding does.

Four places in llama.cpp's CPU kernels round a product over several tokens differently from the same product over
one, so that on a quantized file a near-tie can flip between a method's text and the target's own greedy text:
- llamafile's matrix kernels, built in by default, take every matrix product of two or more rows; ggml's own
  kernel takes one row;
- the flash-attention kernel for several queries differs from its one-query kernel;
- weights repacked into interleaved blocks at load (q4_0, q4_K and others on x86: llama.cpp's "extra buffer
  types") are multiplied by a several-row kernel for four or more rows and a one-row kernel otherwise;
- a tiled K-quant matrix product (ggml-cpu/tiled) takes products of eight or more rows of q2_K-q6_K and IQ weights;
  llama.cpp turns it off when the environment has GGML_CPU_TILED_MM=0 (TILED_MM_ENV).
A library built without llamafile (INVARIANT_BUILD_SCRIPT, or llama-cpp-python installed with
CMAKE_ARGS="-DGGML_LLAMAFILE=OFF") is the exact kernels' library: on it the backend loads weights unrepacked and
turns the tiled product off for the process (GGUFModel, exact_kernels_setup), so with flash attention off a chain's
tokens score as one-token decoding does. Measured on float, q4_0, q8_0, q4_k_m, q5_k_m and q6_k files
(EXACT_FILE_TYPES, TILED_FILE_TYPES); other quantized types are not claimed. A token tree's masked siblings sit
between a node's ancestors in the KV cache, which moves cells between the lanes of the attention-times-V dot
product; so a greedy verdict on a tree keeps only its first branch's tokens (laid out as a chain) as scored, and the
backend decodes the rest of a kept branch again as a chain (LlamaCppLM.rescore_branch, llamacpp_settle.py), which
makes tree methods exact too.
"""

from __future__ import annotations

import os

INVARIANT_BUILD_SCRIPT = "scripts/build_llama_cpp_invariant_lib.sh"
LIB_BUILD_SCRIPT = "scripts/build_llama_cpp_lib.sh"  # llama.cpp's kernels, built for Python's calls (docs/backends.md)
TILED_MM_ENV = "GGML_CPU_TILED_MM"  # llama.cpp's tiled K-quant matrix product: on unless this is "0"
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python loads the library from this folder when it is set
# llama.cpp's own default (flash_attn_type auto) turns flash attention on for the CPU; it is said here, and given
# to the bench's llama-cpp-python peers (whose Llama() turns it off unless asked), so that every llama.cpp row of a
# comparison computes the same logits with the same kernels; load(flash_attn=False) / --no-flash-attn turn it off.
# Off, on a library without llamafile's kernels, a chain's verify pass is batch-invariant
FLASH_ATTENTION = True


def library_missing(err: Exception) -> str:
    """What to do when llama-cpp-python finds no llama.cpp library to load."""
    folder = os.environ.get(LIB_PATH_ENV)
    if folder is not None:  # set, even empty: llama-cpp-python looked there, not in its own folder
        return (
            f"${LIB_PATH_ENV}={folder} holds no llama.cpp library ({err}): point it at the folder "
            f"{LIB_BUILD_SCRIPT} or {INVARIANT_BUILD_SCRIPT} printed, or unset it to use llama-cpp-python's own"
        )
    return f"llama-cpp-python has no llama.cpp library ({err}): reinstall it, pip install -e '.[llamacpp]'"


def has_llamafile(system_info: str) -> bool:
    """Whether llama_print_system_info's text lists llamafile's kernels as built in."""
    return "LLAMAFILE = 1" in system_info


def library(lib) -> dict:
    """The loaded library (llama-cpp-python's low-level module `lib`): its folder and whether llamafile is in it."""
    info = lib.llama_print_system_info().decode("utf-8", "replace")
    return {"path": os.environ.get(LIB_PATH_ENV) or None, "llamafile": has_llamafile(info)}


def describe_library(lib: dict, flash_attn: bool | None) -> str:
    """For reports: which library `lib` (library()'s dict) is, its kernels and what they mean for exactness, with
    flash attention on or off (None: llama.cpp's default)."""
    flash_attn = FLASH_ATTENTION if flash_attn is None else flash_attn
    where = f"`{LIB_PATH_ENV}={lib['path']}`" if lib["path"] else "llama-cpp-python's own build"
    return f"{where}; {describe(lib['llamafile'], flash_attn)}"


def library_lines(lib: dict | None, flash_attn: bool | None, rows: str = "Our rows'") -> list[str]:
    """A bench report's line naming the library `rows` loaded (library()'s dict, recorded in the result) and what its
    kernels mean, then a blank line; none for a result recorded before the library was (lib None)."""
    if lib is None:
        return []
    return [f"{rows} llama.cpp library: {describe_library(lib, flash_attn)}.", ""]


_tiled_off_by_us = False  # whether exact_kernels_setup set TILED_MM_ENV (peer_environment leaves it out)


def exact_kernels_setup(llamafile: bool) -> bool:
    """Before a model loads: on a library without llamafile (the exact kernels' library) turn the tiled K-quant
    product off for this process, unless the environment sets its switch already, and say to load the weights
    unrepacked (llama_model_params.use_extra_bufts off). Returns whether to keep the weights unrepacked."""
    global _tiled_off_by_us
    if llamafile:
        return False
    if TILED_MM_ENV not in os.environ:
        os.environ[TILED_MM_ENV] = "0"  # read by llama.cpp at its first K-quant product, after this
        _tiled_off_by_us = True
    return True


def peer_environment() -> dict[str, str]:
    """The environment for a peer's process (llama.cpp's own llama-server): this process's, without the switch
    exact_kernels_setup set for our rows, so the peer runs llama.cpp's kernels as a user's shell would."""
    env = dict(os.environ)
    if _tiled_off_by_us:
        env.pop(TILED_MM_ENV, None)
    return env


def kernels_exact(llamafile: bool, flash_attn: bool) -> bool:
    """Whether these kernels round a chain's verify pass as one-token decoding does on a float file: no llamafile
    matrix kernels, no flash attention."""
    return not (llamafile or flash_attn)


def chains_exact(llamafile: bool, flash_attn: bool, file_type: str | None) -> bool:
    """Whether a chain's verify pass rounds every token as one-token decoding does with these kernels on a file of
    this type (GGUFModel.file_type; None: a quantized file of unknown type, not claimed); a k-quant file also needs
    the tiled product off (exact_kernels_setup)."""
    return kernels_exact(llamafile, flash_attn) and exact_file_type(file_type)


def describe(llamafile: bool, flash_attn: bool) -> str:
    """One sentence for reports: the kernels and what they mean for exactness."""
    included = "in" if llamafile else "left out"
    kernels = f"llamafile's matrix kernels {included}, flash attention {'on' if flash_attn else 'off'}"
    if kernels_exact(llamafile, flash_attn):
        return (
            f"{kernels}: a chain's verify pass scores every token bit for bit as one-token decoding does on "
            f"{EXACT_TYPES_TEXT} files (weights unrepacked, the tiled K-quant product off)"
        )
    return (
        f"{kernels}: a verify pass can round differently from one-token decoding, so on a quantized file a near-tie "
        f"can flip (a library without llamafile, {INVARIANT_BUILD_SCRIPT}, and --no-flash-attn make chains exact)"
    )


FLOAT_FILE_TYPES = frozenset({0, 1, 32})  # GGUF general.file_type (llama.cpp's LLAMA_FTYPE_*): F32, F16, BF16
# the file types measured to score chains as one-token decoding does on the exact kernels (the invariant-library
# test): the float types, Q4_0 (2) and Q8_0 (7), and, with the tiled K-quant product off, Q4_K_M (15), Q5_K_M (17)
# and Q6_K (18)
EXACT_FILE_TYPES = FLOAT_FILE_TYPES | {2, 7}
TILED_FILE_TYPES = frozenset({15, 17, 18})
EXACT_TYPES_TEXT = "float, q4_0, q8_0, q4_k_m, q5_k_m and q6_k"  # the two sets above, as messages name them


def covered_file_type(file_type: str | None) -> bool:
    """Whether a GGUF of this type (GGUFModel.file_type: a number as text; None, a quantized file of unknown type: not
    known to be exact) is one the exact kernels, with exact_kernels_setup's settings, make score chains as one-token
    decoding does."""
    if file_type is None or not file_type.strip().isdigit():
        return False
    return int(file_type) in EXACT_FILE_TYPES | TILED_FILE_TYPES


def exact_file_type(file_type: str | None) -> bool:
    """covered_file_type, with the tiled K-quant product off in this process where the type needs it."""
    if not covered_file_type(file_type):
        return False
    return int(file_type) not in TILED_FILE_TYPES or os.environ.get(TILED_MM_ENV) == "0"


def is_quantized(file_type: str | None) -> bool:
    """Whether a GGUF of this type (GGUFModel.file_type: a number as text, None for a quantized file of unknown type)
    is quantized."""
    return file_type is None or not file_type.strip().isdigit() or int(file_type) not in FLOAT_FILE_TYPES


def float_type_by_width(size_bytes: int, n_params: int) -> str | None:
    """For a GGUF without general.file_type: the float type its weights' mean width shows ("0", F32, above 31 bits
    a weight; "1", F16 or BF16, above 15), else None: a quantized file, its type unknown. llama.cpp guesses the type
    from the commonest tensor type; a mean width only tells floats apart from the rest, which is all that claiming
    exactness needs, and errs towards not claiming it."""
    bits = 8 * size_bytes / max(n_params, 1)
    return "0" if bits > 31 else "1" if bits > 15 else None


def exactness_note(quantized: bool, exact_kernels: bool, exact_type: bool = True) -> str | None:
    """What a user running a drafting method on a llama.cpp target should know about its text against the file's
    own greedy text, or None when there is nothing to say (a float file, or exact kernels on a file type they make
    exact: chains_exact). exact_type: whether the exact kernels make the file's type exact (covered_file_type)."""
    if quantized and not exact_type:
        return (
            "this file's quantization type is not one whose verify passes are known to round as one-token decoding "
            "does with any of llama.cpp's kernels, so a near-tie can flip this method's text away from the file's "
            f"own greedy text; for exact texts use a file of a type they cover ({EXACT_TYPES_TEXT}) with the library "
            f"{INVARIANT_BUILD_SCRIPT} builds and --no-flash-attn (docs/backends.md)"
        )
    if quantized and not exact_kernels:
        return (
            "on a quantized file these llama.cpp kernels can round a verify pass differently from one-token decoding, "
            "so a near-tie can flip this method's text away from the file's own greedy text; for exact texts run "
            f"{INVARIANT_BUILD_SCRIPT}, set {LIB_PATH_ENV} to the folder it prints and pass --no-flash-attn "
            "(docs/backends.md)"
        )
    return None
