"""The zoo target's one forward scoring n tokens (StaticCache, 120-token context), with every nn.Linear as shipped
(x @ W.T) against computing it as W @ x.T for up to 16 rows (see scripts/skinny_linear.py), interleaved; also the
largest logit difference between the two. An experiment for the next round, not an engine feature yet.

Usage: python scripts/skinny_linear_model.py
"""
import statistics
import time

import torch

from draftverify.api import zoo_paths
from draftverify.bench.cost import StaticForward, model_for

torch.set_num_threads(2)
model = model_for(zoo_paths("code")["target"], "float32")
ctx = torch.randint(100, 4000, (1, 120), generator=torch.Generator().manual_seed(0))
def skinny_forward(self, x):
    rows = x.numel() // x.shape[-1]
    if rows <= 16:
        out = (self.weight @ x.reshape(rows, -1).t()).t().reshape(*x.shape[:-1], self.weight.shape[0])
        return out if self.bias is None else out + self.bias
    return torch.nn.functional.linear(x, self.weight, self.bias)
lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
def set_skinny(on):
    for m in lins:
        if on: m.forward = skinny_forward.__get__(m)
        elif "forward" in m.__dict__: del m.forward
sf = StaticForward(model, 200, False)
with torch.no_grad():
    sf.prefill(ctx)
    for n in (1, 2, 4, 8, 16):
        ids = ctx[:, :n]
        for on in (False, True):
            set_skinny(on)
            for _ in range(3): sf.step(ids, 120)
        ts = {False: [], True: []}
        for _ in range(20):
            for on in (False, True):
                set_skinny(on)
                t = time.perf_counter(); out = sf.step(ids, 120); ts[on].append(time.perf_counter() - t)
        set_skinny(False); a = sf.step(ids, 120); set_skinny(True); b = sf.step(ids, 120)
        print(n, "default", round(1000*statistics.median(ts[False]), 1), "skinny", round(1000*statistics.median(ts[True]), 1), "maxdiff", float((a-b).abs().max()), flush=True)
