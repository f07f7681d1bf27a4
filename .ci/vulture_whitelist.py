# Names the dead-code check (vulture, [tool.vulture] in pyproject.toml) is to take as used: each is read by name by
# something vulture does not see (a library, C, a string, pytest). Not imported by anything; a name no longer in the
# code is simply never matched. Add a line here only with the reason beside it.

# fields of llama.cpp's C structs (llama_context_params, model params) set for llama.cpp to read
_.n_batch
_.n_ubatch
_.n_seq_max
_.n_threads
_.n_threads_batch
_.kv_unified
_.no_perf
_.use_extra_bufts
_.ctx_other
# transformers', tokenizers' and torch's settings set for them to read
_.allow_tf32
_.use_cache
_.pre_tokenizer
_.post_processor
_.should_log  # TrainerControl
_.should_training_stop  # TrainerControl
_.should_exit  # uvicorn.Server
_.openapi  # FastAPI's OpenAPI document builder
_.__annotations__  # cli_flags: typer reads a command's signature
# arguments a caller's signature requires: a ctypes log callback, a typer callback, a signal handler, Trainer hooks,
# lru_cache keys, monkeypatched stand-ins, pytest fixtures a test asks for by name for their effect
user_data
parameter
frame
num_items_in_batch
return_outputs
num_training_steps
mtime_ns
q_
float64_softmax
code_zoo_without_nat
no_gpu
one_gpu
two_threads
# loaded from "module:function" strings (backends/registry.py's loaders, a test's toy backend) or registered by a
# decorator vulture does not know (schemathesis.check)
load_hf
load_llamacpp
toy_loader
valid_data_accepted
# called by a library: a draft model llama.cpp's speculative decoding calls as a function
__call__
# class attributes read with getattr (backends/base.py's offers())
rows_take_trees
# dataclass and pydantic fields: written to JSON (asdict, model_dump) and read by clients, or options a test declares
healed_prompts
first_token_changed
chrf_reference
equal_to_baseline
_.equal_to_baseline
presence_penalty
frequency_penalty
user
total_tokens
owned_by
max_model_len
speculative_methods
queued
running_rows
toy_weights
other_nat
_.nat_dir
