"""The hf backend: a Hugging Face transformers model and its KV cache behind the backend protocol (../base.py).

- cached_lm.py        CachedLM: the model, its cache and its own position counter (start, forward, commit); the
                      plain layout (one row) and the forward
- rows.py             CachedLM's rows layout: left padding, gaps, packing, rows leaving and joining
- compiled_widths.py  CachedLM's compiled forward: width buckets, cache windows, recompile limits
- cache.py            keep a prefix (chain) or gather a branch (tree) of Hugging Face's cache objects
- prefix.py           a deep prompt: per-layer keys and values only some positions of a forward attend to
- shallow_view.py     a model's first layers as a model sharing its weights (first_layers: early exit)
- few_row_linear.py   linears on 2-16 rows as W @ x.T on the CPU (a torch function mode around each forward)
- greedy.py           Hugging Face's own greedy generate on a left-padded batch (a reference, a recipe's data)

Nothing is imported here: importing a module of this package loads transformers (few_row_linear.py: torch only),
which the CLI's help and the backend registry do not wait for.
"""
