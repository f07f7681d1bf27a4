"""The seed papers' reproductions, apart from the product: `draftverify reproduce <paper>` (commands.py) reruns a
paper's tables and ablations on our models through the one decoding loop.

Modules: leviathan (speculative decoding's closed-form tables, from draftverify.theory; no model runs), translation
(SpecDec's and SpecDec++'s sweeps and BiLD's thresholds on an encoder-decoder pair), blockwise (blockwise parallel
decoding's draft analyses: lattices, rescoring, repetition, head entropy), bita (BiTA's decoding modes, prompt
designs and token counts), healing (token healing on HumanEval). They read prompts, write reports and describe the
machine through bench/ (prompts, report, environment, folders).
"""
