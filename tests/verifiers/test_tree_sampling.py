"""Distribution tests that define the exactness of tree speculative sampling (multi-draft, SpecInfer-style).

The function is called directly on hand-made target and drafter models over a vocabulary of 6 tokens. A batch of
B independent rows plays the role of B independent runs; each row drafts its own tree top-down (so rows hold
different tokens and take different paths). The models are Markov in the last token with a table per depth:
p after the root is P_ROOT, p after a depth-d token t is P_NEXT[d - 1][t] (q likewise), so p_probs[:, 1 + j]
really is the target's distribution after the path to node j and the target's own law of the next k tokens is
P_ROOT(t0) * P_NEXT[0](t0, t1) * P_NEXT[1](t1, t2).

Exactness means the tokens a step emits, continued by the target's own sampling where the step stopped (the
next step's first token is drawn from the target, exactly, by induction), follow that law. So for k = 1, 2, 3
the first k tokens (emitted, then continued from P_NEXT where the step stopped) are tested jointly (V**k cells)
with a Pearson chi-square and an exact p-value. As in test_rejection.py, a correct rule fails one check with
probability 1e-6, and plausible wrong rules (not updating the residual between siblings, accepting every sibling
against the node's original p, zeroing only the rejected token for i.i.d. siblings) are run through the same
statistic and rejected with p-values far below the threshold. A rule that rejects everything would also be
exact, so the acceptance rate is checked against its closed form too.

The rule itself is also checked without sampling noise: the exact law of a step, by enumerating every draft
and accept / reject outcome, equals the target's to 1e-12, and each wrong rule's exact law is at total
variation >= 0.02 from it. The fast path is cross-checked against a plain one-row reference (below) on random
trees with a shared random stream.
"""

from __future__ import annotations

import math

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.sampling import residual, sample
from draftverify.theory import acceptance_rate
from draftverify.verifiers.tree_sampling import tree_accept, tree_speculative_sample

torch.set_num_threads(1)

V = 6
B = 40_000
P_THRESHOLD = 1e-6  # a correct rule fails one check with probability 1e-6

SHAPES = {
    "chain": [-1, 0, 1],
    "star3": [-1, -1, -1],
    # depth 3 with branching: root -> {0, 1}; 0 -> {2, 3}; 1 -> {4}; 2 -> {5, 6}
    "tree7": [-1, -1, 0, 0, 1, 2, 2],
}


def _filtered_softmax(logits: torch.Tensor, drop: int) -> torch.Tensor:
    """softmax with the `drop` smallest logits of each row removed (a top-k filtered target has p = 0 tokens)."""
    if drop:
        kth = logits.sort(dim=-1).values[..., drop - 1 : drop]
        logits = logits.masked_fill(logits <= kth, float("-inf"))
    return logits.softmax(-1)


_g = torch.Generator().manual_seed(2024)
_P_LOGITS = [torch.randn(V, generator=_g, dtype=torch.float64) * 1.3] + [
    torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.3 for _ in range(3)
]
P_ROOT = _filtered_softmax(_P_LOGITS[0], 1)  # [V], one token filtered out
P_NEXT = [_filtered_softmax(lg, 1) for lg in _P_LOGITS[1:]]  # after a depth-1, 2, 3 token: [V (prev), V]
# drafter: favours what the target dislikes, full support (so drafts include p = 0 tokens)
Q_ROOT = 0.6 * (-0.7 * _P_LOGITS[0]).softmax(-1) + 0.4 / V
Q_NEXT = [0.6 * (-0.7 * lg).softmax(-1) + 0.4 / V for lg in _P_LOGITS[1:]]
# deterministic candidates: the children of a node are the top-ranked tokens of a fixed score (a top-k drafter
# that is right often but not always: the target's logits plus noise), so candidates depend on the parent only
RANK = [lg + torch.randn(lg.shape, generator=_g, dtype=torch.float64) * 1.5 for lg in _P_LOGITS]


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for u in parents:
        out.append(1 if u < 0 else out[u] + 1)
    return out


def make_tree_batch(parents: list[int], batch: int, gen: torch.Generator, mode: str, q_equals_p: bool = False):
    """Draft every row's tree top-down. mode 'iid': each node's token ~ q after its parent (siblings i.i.d.);
    'deterministic': siblings are the parent's top-ranked distinct tokens under RANK, in rank order; q_probs None.
    Returns (parents tensor, draft tokens [B, N], q_probs [B, N, V] | None, p_probs [B, N+1, V])."""
    n, d = len(parents), depths(parents)
    tokens = torch.zeros(batch, n, dtype=torch.long)
    q_probs = torch.zeros(batch, n, V, dtype=torch.float64)
    p_probs = torch.zeros(batch, n + 1, V, dtype=torch.float64)
    p_probs[:, 0] = P_ROOT
    for j, u in enumerate(parents):
        if q_equals_p:
            q_row = P_ROOT.expand(batch, V) if u < 0 else P_NEXT[d[u] - 1][tokens[:, u]]
        else:
            q_row = Q_ROOT.expand(batch, V) if u < 0 else Q_NEXT[d[u] - 1][tokens[:, u]]
        if mode == "iid":
            tokens[:, j] = torch.multinomial(q_row, 1, generator=gen)[:, 0]
        else:
            score = RANK[0].expand(batch, V) if u < 0 else RANK[d[u]][tokens[:, u]]
            rank = sum(1 for k in range(j) if parents[k] == u)
            tokens[:, j] = score.argsort(-1, descending=True)[:, rank]
        q_probs[:, j] = q_row
        p_probs[:, 1 + j] = P_NEXT[d[j] - 1][tokens[:, j]]
    return torch.tensor(parents, dtype=torch.long), tokens, (q_probs if mode == "iid" else None), p_probs


def chi2_pvalue_counts(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson chi-square of observed counts against expected counts (same total). 0 on an impossible cell.

    Categories with expected count < 10 are pooled so the chi-square approximation holds.
    """
    counts, expected = counts.double(), expected.double()
    if counts[expected == 0].sum() > 0:
        return 0.0
    big = expected >= 10
    small = ~big & (expected > 0)
    obs = torch.cat([counts[big], counts[small].sum()[None]])
    exp = torch.cat([expected[big], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df == 0:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


def chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of 1-D samples (cell indices) to probs [C]."""
    counts = torch.bincount(tokens, minlength=probs.numel())
    return chi2_pvalue_counts(counts, tokens.numel() * probs)


def target_law(k: int) -> torch.Tensor:
    """The target's law of its next k tokens, flattened to [V**k] (t0 most significant)."""
    law = P_ROOT
    for i in range(1, k):
        law = (law.reshape(-1, V)[:, :, None] * P_NEXT[i - 1][None]).reshape(-1, V)  # [V**(i-1), V, V]
    return law.reshape(-1)


def continued(tokens: torch.Tensor, num_accepted: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """The first k tokens of the output: the step's emitted tokens, then the target's own sampling. [B, k]."""
    out = tokens[:, :k].clone()
    for i in range(k):
        stopped = num_accepted < i  # the step emitted only num_accepted + 1 < i + 1 tokens
        if i == 0 or not stopped.any():
            continue
        fresh = torch.multinomial(P_NEXT[i - 1][out[:, i - 1]], 1, generator=gen)[:, 0]
        out[:, i] = torch.where(stopped, fresh, out[:, i])
    return out


def joint_pvalues(tokens: torch.Tensor, num_accepted: torch.Tensor, seed: int, ks=(1, 2, 3)) -> dict[int, float]:
    # a stream unrelated to the one that drafted the tree (replaying that seed would correlate the continuation
    # with the drafts and bias the statistic)
    gen = torch.Generator().manual_seed(7_919_000 + seed)
    seq = continued(tokens, num_accepted, max(ks), gen)
    out = {}
    for k in ks:
        cell = (seq[:, :k] * (V ** torch.arange(k - 1, -1, -1))).sum(-1)
        out[k] = chi2_pvalue(cell, target_law(k))
    return out


def total_variation(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / tokens.numel()
    return 0.5 * float((freq - probs).abs().sum())


def check_structure(parents, draft_tokens, p_probs, path, tokens, num_accepted, exact_residual: bool = True):
    """Paths follow parent links from the root, tokens are the path's then one legal token, then -1 padding."""
    batch, n = draft_tokens.shape
    assert path.shape == (batch, n) and tokens.shape == (batch, n + 1) and num_accepted.shape == (batch,)
    assert path.dtype == tokens.dtype == num_accepted.dtype == torch.long
    assert ((num_accepted >= 0) & (num_accepted <= n)).all()
    pos = torch.arange(n + 1)[None]
    prefix = pos[:, :n] < num_accepted[:, None]  # [B, N]
    assert (path[~prefix] == -1).all() and (path[prefix] >= 0).all()
    prev = torch.full((batch,), -1)
    p_prev = p_probs[:, 0]
    for i in range(n):
        on = num_accepted > i
        node = path[:, i].clamp_min(0)
        assert (parents[node][on] == prev[on]).all()  # node i of the path is a child of node i - 1 (root first)
        x = draft_tokens.gather(1, node[:, None])[:, 0]
        assert (tokens[on, i] == x[on]).all()
        assert (p_prev.gather(1, x[:, None])[on, 0] > 0).all()  # an accepted token is possible under the target
        prev = torch.where(on, node, prev)
        p_prev = torch.where(on[:, None], p_probs[torch.arange(batch), 1 + node], p_prev)
    final = tokens.gather(1, num_accepted[:, None])[:, 0]
    assert ((final >= 0) & (final < p_probs.shape[-1])).all()
    assert (p_prev.gather(1, final[:, None])[:, 0] > 0).all()  # the final token is possible after the last node
    assert (tokens[pos > num_accepted[:, None]] == -1).all()
    if exact_residual:  # a rejected child has residual mass 0 from then on: never the final token
        for j in range(n):
            tried = prev == parents[j]
            assert (final[tried] != draft_tokens[tried, j]).all()


def run(shape: str, mode: str, seed: int, batch: int = B, q_equals_p: bool = False, sampler=None):
    gen = torch.Generator().manual_seed(seed)
    parents, x, q, p = make_tree_batch(SHAPES[shape], batch, gen, mode, q_equals_p=q_equals_p)
    sampler = sampler or tree_speculative_sample
    path, tokens, num_accepted = sampler(parents, x, q, p, gen)
    return parents, x, q, p, path, tokens, num_accepted


# ----------------------------------------------------------------------------------------------------------
# the reference: one row, plain loops (used only to cross-check the fast path)
# ----------------------------------------------------------------------------------------------------------


def reference_tree_sample_row(
    parents: list[int], tokens: list[int], q: torch.Tensor | None, p: torch.Tensor, uniforms: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """parents, tokens: N ints; q [N, V] or None (one-hot); p [N+1, V]; uniforms [N] -> (path, p_next [V])."""
    u, p_res, path = -1, p[0].clone(), []
    while True:
        for c in [j for j in range(len(parents)) if parents[j] == u]:  # u's children in index order
            x = tokens[c]
            q_c = q[c] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).to(p.dtype)
            if uniforms[c] * q_c[x] < p_res[x]:  # accept with probability min(1, p_res(x) / q(x))
                break
            r = (p_res - q_c).clamp(min=0)  # rejected: the residual becomes the target for the next sibling
            if r.sum() > 0:
                p_res = r / r.sum()
        else:  # every child rejected (or u is a leaf): the final token comes from p_res
            return path, p_res
        path.append(c)
        u, p_res = c, p[1 + c].clone()


def random_case(gen: torch.Generator, trial: int):
    n = int(torch.randint(0, 10, (1,), generator=gen))
    batch = int(torch.randint(1, 8, (1,), generator=gen))
    vocab = int(torch.randint(2, 10, (1,), generator=gen))
    parents = [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(n)]
    p = (torch.randn(batch, n + 1, vocab, generator=gen, dtype=torch.float64) * 2).softmax(-1)
    zero = torch.rand(batch, n + 1, vocab, generator=gen) < 0.25
    zero[..., 0] &= ~zero[..., 1:].all(-1)  # keep at least one token
    p = torch.where(zero, 0.0, p)
    p = p / p.sum(-1, keepdim=True)
    mode = trial % 4  # 0: deterministic; 1: i.i.d. siblings; 2: a q per node; 3: q == p at the parent
    if mode == 0:
        return parents, torch.randint(0, vocab, (batch, n), generator=gen), None, p
    q = torch.zeros(batch, n, vocab, dtype=torch.float64)
    tokens = torch.zeros(batch, n, dtype=torch.long)
    shared = {}
    for j, u in enumerate(parents):
        if mode == 3:
            q[:, j] = p[:, 1 + u]  # u = -1 gives p[:, 0]
        elif mode == 1 and u in shared:
            q[:, j] = shared[u]
        else:
            q[:, j] = (torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 1.5).softmax(-1)
            shared[u] = q[:, j]
        tokens[:, j] = torch.multinomial(q[:, j], 1, generator=gen)[:, 0]
    return parents, tokens, q, p


# ----------------------------------------------------------------------------------------------------------
# the chi-square check itself: sane on exact samples, powerful against a small shift
# ----------------------------------------------------------------------------------------------------------


def test_chi2_check_accepts_exact_joint_samples_and_rejects_a_small_shift():
    gen = torch.Generator().manual_seed(0)
    law = target_law(2)
    draws = sample(law.float().expand(B, V * V), gen)
    assert chi2_pvalue(draws, law) > P_THRESHOLD
    shifted = law.clone()
    big = law.argsort()[-2:]
    shifted[big[0]] += 0.02
    shifted[big[1]] -= 0.02  # total variation 0.02
    assert chi2_pvalue(draws, shifted) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------
# exactness: the first 1, 2 and 3 output tokens follow the target's law
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_output_follows_target_law(shape, mode):
    seed = 100 + 10 * list(SHAPES).index(shape) + (mode == "iid")
    parents, x, q, p, path, tokens, num_accepted = run(shape, mode, seed)
    check_structure(parents, x, p, path, tokens, num_accepted)
    depth = max(depths(SHAPES[shape]))
    assert int((num_accepted == depth).sum()) > 1000  # leaves are reached: the bonus token is exercised
    assert int((num_accepted == 0).sum()) > 1000  # and the root residual too
    for k, pval in joint_pvalues(tokens, num_accepted, seed).items():
        assert pval > P_THRESHOLD, f"{shape}/{mode}: first {k} tokens, p-value {pval:.3g}"


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
def test_every_depth_follows_target_given_its_prefix(mode):
    """Position i of the emitted tokens, among rows that reached it, follows P_NEXT[i - 1] given token i - 1."""
    parents, x, q, p, path, tokens, num_accepted = run("tree7", mode, seed=7 + (mode == "iid"))
    for i in range(1, 4):
        rows = num_accepted >= i
        prev, cur = tokens[rows, i - 1], tokens[rows, i]
        counts = torch.bincount(prev * V + cur, minlength=V * V)
        expected = (torch.bincount(prev, minlength=V).double()[:, None] * P_NEXT[i - 1]).reshape(-1)
        assert int(rows.sum()) > 1000
        assert chi2_pvalue_counts(counts, expected) > P_THRESHOLD, (i, int(rows.sum()))


def test_acceptance_rate_of_iid_siblings_matches_closed_form():
    """P(some root child accepted) = 1 - prod_i (1 - beta_i), beta_i = sum min(p_i, q), p_{i+1} = residual."""
    _, _, _, _, _, _, num_accepted = run("star3", "iid", seed=31)
    p_i, reject_all = P_ROOT, 1.0
    for _ in range(3):
        beta = float(acceptance_rate(p_i, Q_ROOT))
        reject_all *= 1 - beta
        p_i = residual(p_i, Q_ROOT)
    expected = 1 - reject_all
    rate = float((num_accepted == 1).double().mean())
    assert abs(rate - expected) < 5 * math.sqrt(expected * (1 - expected) / B)
    # more siblings accept more often than one draft (sum min(p, q)): the point of a tree
    assert expected > float(acceptance_rate(P_ROOT, Q_ROOT)) + 0.1


def test_acceptance_rate_of_deterministic_candidates_is_their_target_mass():
    """Distinct candidates S are accepted with total probability p(S) (each x_i with p_res(x_i), p_res renormalised)."""
    candidates = [int(t) for t in P_ROOT.argsort(descending=True)[[1, 3, 0]]]
    parents = torch.tensor([-1, -1, -1])
    x = torch.tensor(candidates)[None].expand(B, 3).contiguous()
    p = torch.stack([P_ROOT] + [P_NEXT[0][c] for c in candidates])[None].expand(B, 4, V)
    _, tokens, num_accepted = tree_speculative_sample(parents, x, None, p, torch.Generator().manual_seed(32))
    expected = float(P_ROOT[candidates].sum())
    rate = float((num_accepted == 1).double().mean())
    assert abs(rate - expected) < 5 * math.sqrt(expected * (1 - expected) / B)
    for c in candidates:  # each candidate is emitted exactly as often as the target says
        share = float((tokens[:, 0] == c).double().mean())
        assert abs(share - float(P_ROOT[c])) < 5 * math.sqrt(float(P_ROOT[c]) / B)


def test_heterogeneous_batch_rows_follow_their_own_target():
    """Two interleaved populations (different trees' tokens and p per row): each subset follows its own law."""
    gen = torch.Generator().manual_seed(41)
    parents, x, q, p = make_tree_batch(SHAPES["tree7"], B, gen, "iid")
    flipped = torch.where(torch.arange(B)[:, None, None] % 2 == 1, p.flip(-1), p)  # odd rows: reversed vocabulary
    q_flipped = torch.where(torch.arange(B)[:, None, None] % 2 == 1, q.flip(-1), q)
    x_flipped = torch.where(torch.arange(B)[:, None] % 2 == 1, V - 1 - x, x)
    path, tokens, num_accepted = tree_speculative_sample(parents, x_flipped, q_flipped, flipped, gen)
    check_structure(parents, x_flipped, flipped, path, tokens, num_accepted)
    odd = torch.arange(B) % 2 == 1
    unflipped = torch.where(odd[:, None] & (tokens >= 0), V - 1 - tokens, tokens)
    for rows in (odd, ~odd):
        for k, pval in joint_pvalues(unflipped[rows], num_accepted[rows], seed=42, ks=(1, 2)).items():
            assert pval > P_THRESHOLD, (k, pval)


# ----------------------------------------------------------------------------------------------------------
# deliberately wrong rules: the same statistic must reject them
# ----------------------------------------------------------------------------------------------------------


def variant_tree_sample(update):
    """tree_speculative_sample with a pluggable update of p_res after a rejected sibling (same random stream).

    update(p_res, p_node, q_j, x) -> new p_res; p_node is the target's p at the current node."""

    def sampler(parents, draft_tokens, q_probs, p_probs, generator):
        batch, n = draft_tokens.shape
        rows = torch.arange(batch)
        uniforms = torch.rand((batch, n), generator=generator)
        current, depth = torch.full((batch,), -1), torch.zeros(batch, dtype=torch.long)
        path = torch.full((batch, n + 1), -1)
        p_node = p_res = p_probs[:, 0]
        for j in range(n):
            x = draft_tokens[:, j : j + 1]
            q_j = torch.zeros_like(p_res).scatter_(-1, x, 1.0) if q_probs is None else q_probs[:, j]
            trying = current == parents[j]
            accept = trying & (uniforms[:, j] * q_j.gather(-1, x)[:, 0] < p_res.gather(-1, x)[:, 0])
            reject = trying & ~accept
            p_res = torch.where(reject[:, None], update(p_res, p_node, q_j, x), p_res)
            p_res = torch.where(accept[:, None], p_probs[:, 1 + j], p_res)
            p_node = torch.where(accept[:, None], p_probs[:, 1 + j], p_node)
            path[rows, torch.where(accept, depth, n)] = j
            depth, current = depth + accept.long(), torch.where(accept, j, current)
        final = sample(p_res, generator)
        tokens = torch.full((batch, n + 1), -1)
        tokens[:, :n] = torch.where(path[:, :n] >= 0, draft_tokens.gather(1, path[:, :n].clamp_min(0)), -1)
        tokens[rows, depth] = final
        return path[:, :n], tokens, depth

    return sampler


def _one_hot(x, like):
    return torch.zeros_like(like).scatter_(-1, x, 1.0)


EXACT_UPDATE = lambda p_res, p_node, q_j, x: residual(p_res, q_j)  # noqa: E731
WRONG_RULES = {
    # every sibling tested against the node's p; the final token from p
    "no_residual_update": lambda p_res, p_node, q_j, x: p_res,
    # every sibling tested against the node's original p (min(1, p/q)); final from norm(max(p - q_last, 0))
    "each_sibling_against_original_p": lambda p_res, p_node, q_j, x: residual(p_node, q_j),
    # the deterministic-candidate rule used for i.i.d. siblings: zero the rejected token only
    "zero_rejected_token_only": lambda p_res, p_node, q_j, x: residual(p_res, _one_hot(x, p_res)),
}


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
def test_variant_harness_with_the_exact_update_reproduces_the_function(mode):
    """So the wrong-rule tests below differ from the real function in the update rule only."""
    a = run("tree7", mode, seed=51, batch=5000)
    b = run("tree7", mode, seed=51, batch=5000, sampler=variant_tree_sample(EXACT_UPDATE))
    for u, v in zip(a[4:], b[4:]):
        assert torch.equal(u, v)


@pytest.mark.parametrize(
    "rule,mode",
    [
        ("no_residual_update", "iid"),
        ("no_residual_update", "deterministic"),
        ("each_sibling_against_original_p", "iid"),
        ("each_sibling_against_original_p", "deterministic"),
        ("zero_rejected_token_only", "iid"),
    ],
)
@pytest.mark.parametrize("shape", ["star3", "tree7"])
def test_wrong_rule_is_rejected_by_the_same_statistic(shape, rule, mode):
    seed = 60 + list(WRONG_RULES).index(rule) + 3 * (mode == "iid") + 7 * (shape == "tree7")
    sampler = variant_tree_sample(WRONG_RULES[rule])
    parents, x, q, p, path, tokens, num_accepted = run(shape, mode, seed, sampler=sampler)
    pvals = joint_pvalues(tokens, num_accepted, seed, ks=(1, 2))
    assert min(pvals.values()) < P_THRESHOLD, pvals
    assert total_variation(tokens[:, 0], P_ROOT) > 0.01  # a real bias, not a fluke of the statistic


def test_wrong_rule_on_a_chain_equals_the_chain_rule_and_passes():
    """Control: with no siblings the 'original p' rule is the correct rule, and the statistic accepts it."""
    seed = 70
    *_, tokens, num_accepted = run(
        "chain", "iid", seed, sampler=variant_tree_sample(WRONG_RULES["each_sibling_against_original_p"])
    )
    for k, pval in joint_pvalues(tokens, num_accepted, seed).items():
        assert pval > P_THRESHOLD, (k, pval)


# ----------------------------------------------------------------------------------------------------------
# the fast path agrees with the plain reference on random trees (shared random stream)
# ----------------------------------------------------------------------------------------------------------


def test_fast_path_matches_reference_on_random_trees():
    gen = torch.Generator().manual_seed(90)
    accepted_some = zero_rejected = 0
    for trial in range(160):
        parents, x, q, p = random_case(gen, trial)
        batch, n = x.shape
        uniforms = torch.rand(batch, n, generator=gen, dtype=torch.float64)
        path, num_accepted, p_next = tree_accept(torch.tensor(parents, dtype=torch.long), x, q, p, uniforms)
        for b in range(batch):
            ref_path, ref_next = reference_tree_sample_row(
                parents, x[b].tolist(), None if q is None else q[b], p[b], uniforms[b]
            )
            assert path[b].tolist() == ref_path + [-1] * (n - len(ref_path)), (trial, b)
            assert int(num_accepted[b]) == len(ref_path)
            torch.testing.assert_close(p_next[b], ref_next, rtol=0, atol=1e-12)
            if trial % 4 == 3:  # q == p at every parent: the first child is always accepted
                chain = []
                while True:
                    kids = [j for j in range(n) if parents[j] == (chain[-1] if chain else -1)]
                    if not kids:
                        break
                    chain.append(kids[0])
                assert ref_path == chain
            accepted_some += len(ref_path) > 0
            zero_rejected += len(ref_path) == 0 and any(u == -1 for u in parents)
    assert accepted_some > 100 and zero_rejected > 50  # both outcomes are well exercised


def test_full_function_replays_reference_with_the_same_generator():
    gen = torch.Generator().manual_seed(91)
    for trial in range(40):
        parents, x, q, p = random_case(gen, trial)
        batch, n = x.shape
        seed = 1000 + trial
        path, tokens, num_accepted = tree_speculative_sample(
            torch.tensor(parents), x, q, p, torch.Generator().manual_seed(seed)
        )
        replay = torch.Generator().manual_seed(seed)
        uniforms = torch.rand((batch, n), generator=replay)
        refs = [
            reference_tree_sample_row(parents, x[b].tolist(), None if q is None else q[b], p[b], uniforms[b])
            for b in range(batch)
        ]
        final = sample(torch.stack([r[1] for r in refs]), replay)
        for b, (ref_path, _) in enumerate(refs):
            expected = [int(x[b, j]) for j in ref_path] + [int(final[b])]
            assert tokens[b].tolist() == expected + [-1] * (n + 1 - len(expected)), (trial, b)
            assert path[b].tolist() == ref_path + [-1] * (n - len(ref_path))


# ----------------------------------------------------------------------------------------------------------
# edge cases
# ----------------------------------------------------------------------------------------------------------


def test_empty_tree_samples_from_p_at_the_root():
    p = P_ROOT[None, None].expand(B, 1, V)
    path, tokens, num_accepted = tree_speculative_sample(
        torch.zeros(0, dtype=torch.long), torch.zeros(B, 0, dtype=torch.long), None, p, torch.Generator().manual_seed(1)
    )
    assert path.shape == (B, 0) and tokens.shape == (B, 1)
    assert (num_accepted == 0).all()
    assert chi2_pvalue(tokens[:, 0], P_ROOT) > P_THRESHOLD
    # with q_probs given as an empty tensor too
    _, tokens, _ = tree_speculative_sample(
        torch.zeros(0, dtype=torch.long),
        torch.zeros(B, 0, dtype=torch.long),
        torch.zeros(B, 0, V),
        p,
        torch.Generator().manual_seed(2),
    )
    assert chi2_pvalue(tokens[:, 0], P_ROOT) > P_THRESHOLD


@pytest.mark.parametrize("shape", list(SHAPES))
def test_q_equal_to_p_always_accepts_the_first_child(shape):
    parents, x, q, p, path, tokens, num_accepted = run(shape, "iid", seed=81, q_equals_p=True)
    first_chain, u = [], -1
    while True:
        kids = [j for j, v in enumerate(SHAPES[shape]) if v == u]
        if not kids:
            break
        u = kids[0]
        first_chain.append(u)
    n = len(SHAPES[shape])
    assert (path == torch.tensor(first_chain + [-1] * (n - len(first_chain)))).all()
    assert (num_accepted == len(first_chain)).all()
    check_structure(parents, x, p, path, tokens, num_accepted, exact_residual=False)
    # the bonus token follows p after the leaf, given the leaf's token
    d = len(first_chain)
    leaf, bonus = tokens[:, d - 1], tokens[:, d]
    counts = torch.bincount(leaf * V + bonus, minlength=V * V)
    expected = (torch.bincount(leaf, minlength=V).double()[:, None] * P_NEXT[d - 1]).reshape(-1)
    assert chi2_pvalue_counts(counts, expected) > P_THRESHOLD
    for k, pval in joint_pvalues(tokens, num_accepted, seed=81).items():
        assert pval > P_THRESHOLD, (k, pval)


def test_deterministic_candidate_with_certain_target_is_always_accepted():
    """q one-hot and p one-hot at the same token: acceptance is certain, the residual (empty) is never used."""
    parents = torch.tensor([-1, -1, 0])
    x = torch.tensor([[2, 4, 1]]).expand(1000, 3)
    p = torch.zeros(1000, 4, V, dtype=torch.float64)
    p[:, 0, 2] = 1.0  # the root is sure of token 2 (node 0)
    p[:, 1, 1] = 1.0  # after node 0 sure of token 1 (node 2)
    p[:, 2] = 1.0 / V
    p[:, 3, 5] = 1.0  # after node 2: token 5
    path, tokens, num_accepted = tree_speculative_sample(parents, x, None, p, torch.Generator().manual_seed(3))
    assert (path == torch.tensor([0, 2, -1])).all()
    assert (tokens == torch.tensor([2, 1, 5, -1])).all()
    assert (num_accepted == 2).all()


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
def test_tokens_with_target_probability_zero_are_never_accepted(mode):
    """Root children drafted only among tokens the target filtered out: nothing accepted; output still exact."""
    banned = int(P_ROOT.argmin())
    assert P_ROOT[banned] == 0
    p_zero = P_ROOT.clone()
    p_zero[(banned + 1) % V] = 0.0  # a second zero so siblings can differ
    p_zero = p_zero / p_zero.sum()
    zeros = [banned, (banned + 1) % V]
    parents = torch.tensor([-1, -1, 0])
    x = torch.tensor([zeros[0], zeros[1], 0])[None].expand(B, 3).contiguous()
    p = torch.stack([p_zero, P_NEXT[0][zeros[0]], P_NEXT[0][zeros[1]], P_NEXT[1][0]])[None].expand(B, 4, V)
    q = None
    if mode == "iid":  # a q that put all its mass on the two banned tokens
        q_root = torch.zeros(V, dtype=torch.float64)
        q_root[zeros] = 0.5
        q = torch.stack([q_root, q_root, P_NEXT[0][zeros[0]]])[None].expand(B, 3, V)
    path, tokens, num_accepted = tree_speculative_sample(parents, x, q, p, torch.Generator().manual_seed(4))
    assert (num_accepted == 0).all() and (path == -1).all()
    assert (tokens[:, 1:] == -1).all()
    assert chi2_pvalue(tokens[:, 0], p_zero) > P_THRESHOLD


def test_rows_take_different_paths_with_correct_padding():
    """Hand-made rows with certain outcomes: each row's path, tokens and -1 padding are asserted exactly."""
    parents = torch.tensor([-1, -1, 0, 1, 1])  # root -> {0, 1}; 0 -> {2}; 1 -> {3, 4}
    x = torch.tensor([[0, 1, 2, 3, 4]]).expand(4, 5)
    p = torch.zeros(4, 6, V, dtype=torch.float64)
    # row 0: accepts node 0 then node 2 (leaf), bonus from p after node 2 (token 5)
    p[0, 0, 0], p[0, 1, 2], p[0, 3, 5] = 1.0, 1.0, 1.0
    # row 1: rejects node 0 (p = 0), accepts node 1, rejects node 3, accepts node 4 (leaf), bonus 3
    p[1, 0, 1], p[1, 2, 4], p[1, 5, 3] = 1.0, 1.0, 1.0
    # row 2: accepts node 1, rejects 3 and 4, final from p after node 1 without them (token 5)
    p[2, 0, 1] = 1.0
    p[2, 2, 3], p[2, 2, 4], p[2, 2, 5] = 0.0, 0.0, 1.0
    # row 3: rejects both root children, final from the root's p without them (token 2)
    p[3, 0, 2] = 1.0
    p[:, :, :] = torch.where(p.sum(-1, keepdim=True) == 0, 1.0 / V, p)  # unreachable positions: any distribution
    for q in (None, torch.nn.functional.one_hot(x, V).double()):
        path, tokens, num_accepted = tree_speculative_sample(parents, x, q, p, torch.Generator().manual_seed(5))
        assert path.tolist() == [[0, 2, -1, -1, -1], [1, 4, -1, -1, -1], [1, -1, -1, -1, -1], [-1] * 5]
        assert tokens.tolist() == [
            [0, 2, 5, -1, -1, -1],
            [1, 4, 3, -1, -1, -1],
            [1, 5, -1, -1, -1, -1],
            [2, -1, -1, -1, -1, -1],
        ]
        assert num_accepted.tolist() == [2, 2, 1, 0]


def test_seeded_generator_makes_it_reproducible():
    a = run("tree7", "iid", seed=11, batch=2000)
    b = run("tree7", "iid", seed=11, batch=2000)
    assert all(torch.equal(u, v) for u, v in zip(a[4:], b[4:]))
    gen = torch.Generator().manual_seed(12)
    c = tree_speculative_sample(a[0], a[1], a[2], a[3], gen)
    assert not torch.equal(a[5], c[1])


def test_float32_inputs_are_exact_too():
    gen = torch.Generator().manual_seed(13)
    parents, x, q, p = make_tree_batch(SHAPES["tree7"], B, gen, "iid")
    path, tokens, num_accepted = tree_speculative_sample(parents, x, q.float(), p.float(), gen)
    check_structure(parents, x, p.float(), path, tokens, num_accepted)
    for k, pval in joint_pvalues(tokens, num_accepted, seed=13, ks=(1, 2)).items():
        assert pval > P_THRESHOLD, (k, pval)


@pytest.mark.parametrize(
    "parents,n",
    [([0, -1], 2), ([-1, 1], 2), ([-1, -2], 2), ([-1, 0, 3], 3), ([-1], 2)],
)
def test_bad_parents_raise(parents, n):
    with pytest.raises(DraftVerifyError, match="parents"):
        tree_speculative_sample(
            torch.tensor(parents), torch.zeros(1, n, dtype=torch.long), None, torch.full((1, n + 1, V), 1.0 / V), None
        )


def test_bad_shapes_raise():
    parents = torch.tensor([-1, 0])
    x = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(DraftVerifyError, match="p_probs"):
        tree_speculative_sample(parents, x, None, torch.full((2, 2, V), 1.0 / V), None)
    with pytest.raises(DraftVerifyError, match="q_probs"):
        tree_speculative_sample(parents, x, torch.full((2, 2, V + 1), 1.0 / V), torch.full((2, 3, V), 1.0 / V), None)
    with pytest.raises(DraftVerifyError, match="draft_tokens"):
        tree_speculative_sample(parents, x[0], None, torch.full((2, 3, V), 1.0 / V), None)


# ----------------------------------------------------------------------------------------------------------
# exact laws by enumeration: the rule itself (no sampling noise) and the size of each wrong rule's bias
# ----------------------------------------------------------------------------------------------------------


def p_after(depth: int, token: int) -> torch.Tensor:
    return P_ROOT if depth == 0 else P_NEXT[depth - 1][token]


def exact_law(parents: list[int], mode: str, update, k: int = 2) -> torch.Tensor:
    """The exact law [V**k] of the first k output tokens (emitted, then continued by the target) of one step,
    by enumerating every draft token and accept / reject outcome as the walk meets them (a child's subtree is
    drawn given the child only, so drawing tokens lazily has the same law as drafting the tree first)."""
    d = depths(parents)
    children = {u: [j for j, v in enumerate(parents) if v == u] for u in [-1, *range(len(parents))]}
    weights = V ** torch.arange(k - 1, -1, -1)

    def cont(seq: list[int]) -> torch.Tensor:  # the target's own sampling until k tokens
        out = torch.zeros(V**k, dtype=torch.float64)
        if len(seq) >= k:
            out[int((torch.tensor(seq[:k]) * weights).sum())] = 1.0
            return out
        nxt = p_after(len(seq), seq[-1] if seq else -1)
        for y in range(V):
            if nxt[y] > 0:
                out += nxt[y] * cont(seq + [y])
        return out

    def walk(u: int, kids: list[int], p_res: torch.Tensor, p_node: torch.Tensor, prefix: list[int]):
        if len(prefix) >= k:  # later tokens do not change the first k
            return cont(prefix)
        if not kids:
            return sum(p_res[y] * cont(prefix + [y]) for y in range(V) if p_res[y] > 0)
        depth, token = (0, -1) if u < 0 else (d[u], prefix[-1])
        if mode == "iid":
            q_c = Q_ROOT if u < 0 else Q_NEXT[depth - 1][token]
        else:
            score = RANK[0] if u < 0 else RANK[depth][token]
            rank = len(children[u]) - len(kids)
            q_c = torch.zeros(V, dtype=torch.float64)
            q_c[int(score.argsort(descending=True)[rank])] = 1.0
        c, out = kids[0], torch.zeros(V**k, dtype=torch.float64)
        for x in range(V):
            if q_c[x] == 0:
                continue
            a = min(1.0, float(p_res[x] / q_c[x]))
            if a > 0:
                p_c = p_after(d[c], x)
                out += q_c[x] * a * walk(c, children[c], p_c, p_c, prefix + [x])
            if a < 1:
                out += (
                    q_c[x] * (1 - a) * walk(u, kids[1:], update(p_res, p_node, q_c, torch.tensor([x])), p_node, prefix)
                )
        return out

    return walk(-1, children[-1], P_ROOT, P_ROOT, [])


@pytest.mark.parametrize("mode", ["iid", "deterministic"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_exact_law_of_the_rule_is_the_target_law(shape, mode):
    """Over depth + 1 tokens, so every emitted token (up to the bonus after the deepest leaf) is covered."""
    k = max(depths(SHAPES[shape])) + 1
    law = exact_law(SHAPES[shape], mode, EXACT_UPDATE, k=k)
    torch.testing.assert_close(law, target_law(k), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "rule,mode",
    [
        ("no_residual_update", "iid"),
        ("no_residual_update", "deterministic"),
        ("each_sibling_against_original_p", "iid"),
        ("each_sibling_against_original_p", "deterministic"),
        ("zero_rejected_token_only", "iid"),
    ],
)
@pytest.mark.parametrize("shape", ["star3", "tree7"])
def test_wrong_rules_are_biased_by_far_more_than_the_statistic_can_miss(shape, rule, mode):
    """The wrong rule's exact law is at total variation >= 0.02 from the target's over the first two tokens
    (0.027 to 0.23 here; the smallest is 'each sibling against the original p' on tree7 with i.i.d. siblings),
    while the chi-square check above already rejects a 0.02 shift of a single pair of cells."""
    law = exact_law(SHAPES[shape], mode, WRONG_RULES[rule])
    assert abs(float(law.sum()) - 1) < 1e-12
    assert 0.5 * float((law - target_law(2)).abs().sum()) >= 0.02
