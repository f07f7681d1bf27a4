"""The parts of libllama that llama-cpp-python does not bind, bound here with ctypes.

- llama-ext.h's staging calls: the extraction of a layer's inputs and of the "nextn" state (what llama.cpp's
  draft-eagle3 reads from the target and from its head). libllama exports them without C linkage, so each is looked
  up by its C name first, then by its C++ (Itanium) name.
- The extended batch (`llama_batch_ext`, `llama_process`): an entry may carry both a token id and an embedding,
  which an EAGLE-3 head's decoder reads (the token and the feature g of one pair), and the encoder pass that turns
  the target's features into g.
"""

from __future__ import annotations

import ctypes
import functools

from ..errors import DraftVerifyError

_ctx, _model, _batch = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
_floats = ctypes.POINTER(ctypes.c_float)

PROCESS_ENCODE, PROCESS_DECODE = 0, 1  # enum llama_process_type


class LlamaEmbd(ctypes.Structure):
    """struct llama_embd: a view of n_rows embedding rows of n_embd floats."""

    _fields_ = [("data", _floats), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]


# name -> (C++ name or None, restype, argtypes)
CALLS = {
    "llama_set_embeddings_layer_inp": (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        None,
        [_ctx, ctypes.c_uint32, ctypes.c_bool],
    ),
    "llama_get_embeddings_layer_inp": (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        _floats,
        [_ctx, ctypes.c_uint32],
    ),
    "llama_set_embeddings_nextn": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        None,
        [_ctx, ctypes.c_bool, ctypes.c_bool],
    ),
    "llama_get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", _floats, [_ctx]),
    "llama_get_embeddings_nextn_ith": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        _floats,
        [_ctx, ctypes.c_int32],
    ),
    "llama_model_target_layer_ids": (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        ctypes.POINTER(ctypes.c_int32),
        [_model],
    ),
    "llama_model_target_layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model", ctypes.c_uint32, [_model]),
    "llama_batch_ext_init": (None, _batch, [_ctx]),
    "llama_batch_ext_free": (None, None, [_batch]),
    "llama_batch_ext_clear": (None, None, [_batch]),
    "llama_batch_ext_add_token": (None, ctypes.c_int32, [_batch, ctypes.c_int32, ctypes.c_int32]),
    "llama_batch_ext_add_embd": (None, ctypes.c_int32, [_batch, ctypes.c_int32, LlamaEmbd]),
    "llama_batch_ext_set_pos": (None, ctypes.c_bool, [_batch, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]),
    "llama_batch_ext_set_embd_token": (None, ctypes.c_bool, [_batch, ctypes.c_int32, LlamaEmbd]),
    "llama_batch_ext_set_output_logits": (None, ctypes.c_bool, [_batch, ctypes.c_int32, ctypes.c_bool]),
    "llama_process": (None, ctypes.c_int32, [_ctx, ctypes.c_int, _batch]),
}


@functools.cache
def ext_call(lib, name: str):
    """libllama's `name`, bound with ctypes (lib: llama-cpp-python's module); a one-line error where this build
    has none."""
    mangled, restype, argtypes = CALLS[name]
    shared = lib._lib  # llama-cpp-python's CDLL of libllama
    call = getattr(shared, name, None) or (getattr(shared, mangled, None) if mangled else None)
    if call is None:
        raise DraftVerifyError(
            f"this llama-cpp-python build's libllama has no {name}; install the version the `llamacpp` extra pins"
        )
    call.restype, call.argtypes = restype, argtypes
    return call
