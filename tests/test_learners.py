"""Reference learners against independent references (numpy, scipy, scikit-learn, plain loops)."""

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse.linalg
import torch
from sklearn.linear_model import Ridge
from sklearn.neighbors import KNeighborsRegressor

from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.learners import LEARNERS, run_learner


@pytest.fixture(scope="module")
def prompts():
    p = sample_prompts(TaskConfig(n_dims=4, n_points=10), 6, generator=generator_for(11))
    return p.xs.double(), p.ys.double()


def _prefixes(xs, ys):
    for b in range(xs.shape[0]):
        for t in range(xs.shape[1]):
            yield b, t, xs[b, :t].numpy(), ys[b, :t].numpy()


def test_least_squares_matches_numpy_lstsq(prompts):
    xs, ys = prompts
    w = run_learner("least_squares", xs, ys).weights[0]
    for b, t, x, y in _prefixes(xs, ys):
        ref = np.linalg.lstsq(x, y, rcond=None)[0] if t else np.zeros(4)
        np.testing.assert_allclose(w[b, t].numpy(), ref, atol=1e-8)


def test_ridge_matches_sklearn(prompts):
    xs, ys = prompts
    res = run_learner("ridge", xs, ys, lam=(0.1, 2.0))
    for k, lam in enumerate((0.1, 2.0)):
        for b, t, x, y in _prefixes(xs, ys):
            if t == 0:
                continue
            ref = Ridge(alpha=lam, fit_intercept=False).fit(x, y).coef_
            np.testing.assert_allclose(res.weights[k, b, t].numpy(), ref, atol=1e-8)


def test_online_least_squares_equals_ridge(prompts):
    xs, ys = prompts
    rls = run_learner("online_least_squares", xs, ys, lam=(0.5,)).weights
    ridge = run_learner("ridge", xs, ys, lam=(0.5,)).weights
    torch.testing.assert_close(rls, ridge, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("convention", ["paper", "code"])
def test_gd_iterates_match_a_plain_loop(prompts, convention):
    xs, ys = prompts
    steps = [0, 1, 2, 5, 17]
    res = run_learner("gd", xs, ys, eta=(0.05, "auto"), steps=steps, convention=(convention,))
    for b, t, x, y in _prefixes(xs, ys):
        if t == 0:
            continue
        s = x.T @ x
        eta_auto = 1 / np.linalg.eigvalsh(s / t if convention == "paper" else s).max()
        for e_i, eta in enumerate((0.05, eta_auto)):
            w = np.zeros(4)
            for k in range(max(steps) + 1):
                if k in steps:
                    row = e_i * len(steps) + steps.index(k)
                    np.testing.assert_allclose(res.weights[row, b, t].numpy(), w, rtol=1e-7, atol=1e-9)
                grad = (s @ w - x.T @ y) / (t if convention == "paper" else 1)
                w = w - eta * grad


def test_gd_step_conventions_convert_by_t(prompts):
    xs, ys = prompts
    t = 7
    paper = run_learner("gd", xs[:, :t + 1], ys[:, :t + 1], eta=(0.7,), steps=(3,), convention=("paper",))
    code = run_learner("gd", xs[:, :t + 1], ys[:, :t + 1], eta=(0.1,), steps=(3,), convention=("code",))
    torch.testing.assert_close(paper.weights[0, :, t], code.weights[0, :, t])  # code eta = paper eta / t


def newton_loop(x, y, iterations, alpha):
    s = x.T @ x
    m = alpha * s
    out = []
    for _ in range(iterations + 1):
        out.append(m @ x.T @ y)
        m = 2 * m - m @ s @ m
    return out


def test_newton_matches_matrix_loop_and_hand_worked_2x2():
    # Hand-worked: X = I_2 so S = I; alpha = 1/||S S^T||_2 = 1; M_0 = I = S^+ already.
    xs = torch.eye(2, dtype=torch.float64).unsqueeze(0)
    xs = torch.cat([xs, torch.zeros(1, 1, 2, dtype=torch.float64)], dim=1)  # 3 points, the last is the query
    ys = torch.tensor([[3.0, -1.0, 0.0]], dtype=torch.float64)
    w = run_learner("newton", xs, ys, iterations=(0, 1)).weights
    torch.testing.assert_close(w[0, 0, 2], torch.tensor([3.0, -1.0], dtype=torch.float64))
    # S = diag(4, 1) (X = diag(2, 1)): alpha = 1/16, M_0 = diag(1/4, 1/16), M_1 = 2M_0 - M_0 S M_0 = diag(1/4, 31/256)
    xs = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]], dtype=torch.float64)
    ys = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)  # X^T y = (4, 1)
    w = run_learner("newton", xs, ys, iterations=(0, 1)).weights
    torch.testing.assert_close(w[0, 0, 2], torch.tensor([1.0, 1 / 16], dtype=torch.float64))
    torch.testing.assert_close(w[1, 0, 2], torch.tensor([1.0, 31 / 256], dtype=torch.float64))


@pytest.mark.parametrize("rule", ["spectral", "frobenius"])
def test_newton_matches_loop_and_converges_to_pinv(prompts, rule):
    xs, ys = prompts
    res = run_learner("newton", xs, ys, iterations=range(31), alpha=(rule,))
    for b, t, x, y in _prefixes(xs, ys):
        if t == 0:
            continue
        s = x.T @ x
        ev = np.linalg.eigvalsh(s @ s.T)
        alpha = 1 / ev.max() if rule == "spectral" else 1 / np.sqrt((ev**2).sum())
        ref = newton_loop(x, y, 8, alpha)
        for k in range(9):
            np.testing.assert_allclose(res.weights[k, b, t].numpy(), ref[k], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(res.weights[30, b, t].numpy(), np.linalg.pinv(s) @ x.T @ y, atol=1e-7)


def test_newton_paper_alpha_stalls_spectral_alpha_converges():
    """alpha = 2/||SS^T||_2 (Fu et al. 2024, eq. 8 as printed) leaves the top direction's error at -1."""
    g = np.random.default_rng(0)
    x = torch.tensor(g.standard_normal((1, 10, 4)))
    y = torch.tensor(g.standard_normal((1, 10)))
    t = 9
    target = np.linalg.lstsq(x[0, :t].numpy(), y[0, :t].numpy(), rcond=None)[0]
    rel = lambda rule: np.linalg.norm(run_learner("newton", x, y, iterations=(30,), alpha=(rule,)).weights[0, 0, t].numpy()
                                      - target) / np.linalg.norm(target)
    assert rel("spectral") < 1e-12
    assert rel("paper") > 0.05


def test_newton_log_kappa_vs_gd_kappa_on_ill_conditioned_data():
    task = TaskConfig(n_dims=6, n_points=61, covariance="ill_conditioned", kappa=100.0)
    p = sample_prompts(task, 8, generator=generator_for(3))
    xs, ys = p.xs.double(), p.ys.double()
    ls = run_learner("least_squares", xs, ys).weights[0, :, -1]
    rel = lambda w: ((w - ls).norm(dim=-1) / ls.norm(dim=-1)).max().item()
    newton = run_learner("newton", xs, ys, iterations=range(40)).weights[:, :, -1]
    k_newton = next(k for k in range(40) if rel(newton[k]) < 1e-6)
    steps = [2**k for k in range(20)]
    gd = run_learner("gd", xs, ys, steps=steps).weights[:, :, -1]
    k_gd = next(s for i, s in enumerate(steps) if rel(gd[i]) < 1e-6)
    kappa_s = max(float(torch.linalg.cond(xs[b, :-1].T @ xs[b, :-1])) for b in range(8))
    # M_0 S has smallest eigenvalue 1/kappa^2, so ~2 log2(kappa) doublings, then quadratic convergence
    assert k_newton <= 2 * np.log2(kappa_s) + 8
    assert k_gd >= kappa_s  # O(kappa log 1/eps) steps with the stable step 1/lambda_max
    assert k_gd > 50 * k_newton


def test_ogd_normalized_fits_last_example_and_matches_loop(prompts):
    xs, ys = prompts
    res = run_learner("ogd", xs, ys, eta=("normalized", 0.1))
    for b in range(xs.shape[0]):
        w = np.zeros(4)
        for k in range(xs.shape[1] - 1):
            x, y = xs[b, k].numpy(), ys[b, k].item()
            w = w - 0.1 * (w @ x - y) * x
            np.testing.assert_allclose(res.weights[1, b, k + 1].numpy(), w, atol=1e-10)
            np.testing.assert_allclose(res.weights[0, b, k + 1].numpy() @ x, y, atol=1e-10)


def _torch_optim_reference(xs, ys, b, t, idx, make_opt, steps):
    w = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = make_opt([w])
    out = [w.detach().clone()]
    for k in range(steps):
        batch = idx[k, b, t]
        loss = 0.5 * ((xs[b, batch] @ w - ys[b, batch]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(w.detach().clone())
    return out


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_stochastic_learners_match_torch_optim_on_same_minibatches(prompts, name):
    from probe.learners.stochastic import minibatch_indices

    xs, ys = prompts
    steps = 6
    kwargs = {"eta": (0.05,), "batch_size": (3,), "steps": range(steps + 1), "seed": 4}
    if name == "adam":
        kwargs["eps_placement"] = "torch"
        make = lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    else:
        make = lambda p: torch.optim.SGD(p, lr=0.05)
    res = run_learner(name, xs, ys, **kwargs)
    idx = minibatch_indices(xs.shape[1], xs.shape[0], steps, 3, 4, "cpu")
    for b in (0, 3):
        for t in (1, 5, 9):
            ref = _torch_optim_reference(xs, ys, b, t, idx, make, steps)
            for k in range(steps + 1):
                torch.testing.assert_close(res.weights[k, b, t], ref[k], rtol=1e-9, atol=1e-12)


def test_sgd_is_seeded(prompts):
    xs, ys = prompts
    a = run_learner("sgd", xs, ys, seed=1, steps=(5,)).weights
    b = run_learner("sgd", xs, ys, seed=1, steps=(5,)).weights
    c = run_learner("sgd", xs, ys, seed=2, steps=(5,)).weights
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_cg_matches_scipy_iterates(prompts):
    xs, ys = prompts
    res = run_learner("cg", xs, ys, iterations=range(5))
    for b, t, x, y in _prefixes(xs, ys):
        if t < 5:
            continue
        s, rhs = x.T @ x, x.T @ y
        seen = []
        scipy.sparse.linalg.cg(s, rhs, x0=np.zeros(4), rtol=1e-30, atol=0, maxiter=4, callback=lambda v, seen=seen: seen.append(v.copy()))
        for k, ref in enumerate(seen, start=1):
            np.testing.assert_allclose(res.weights[k, b, t].numpy(), ref, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["bfgs", "lbfgs"])
def test_quasi_newton_reach_scipy_minimiser_and_track_cg(prompts, name):
    """On a quadratic with exact line search, BFGS and L-BFGS iterates equal CG's (Nocedal & Wright
    Thm 6.4 / §7.2); after d steps they are at scipy.optimize's minimiser."""
    xs, ys = prompts
    res = run_learner(name, xs, ys, iterations=range(6))
    cgw = run_learner("cg", xs, ys, iterations=range(6)).weights
    torch.testing.assert_close(res.weights[:3, :, 5:], cgw[:3, :, 5:], rtol=1e-6, atol=1e-8)
    for b, t, x, y in _prefixes(xs, ys):
        if t < 5:
            continue
        s, rhs = x.T @ x, x.T @ y
        ref = scipy.optimize.minimize(lambda w, s=s, rhs=rhs: 0.5 * w @ s @ w - rhs @ w, np.zeros(4),
                                      jac=lambda w, s=s, rhs=rhs: s @ w - rhs,
                                      method="BFGS" if name == "bfgs" else "L-BFGS-B", tol=1e-14).x
        np.testing.assert_allclose(res.weights[5, b, t].numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighting", ["uniform", "distance"])
def test_knn_matches_sklearn(prompts, weighting):
    xs, ys = prompts
    queries = torch.randn(xs.shape[0], 3, 4, dtype=torch.float64)
    res = run_learner("knn", xs, ys, queries, k=(3,), weighting=(weighting,))
    for b, t, x, y in _prefixes(xs, ys):
        if t < 3:
            continue
        ref = KNeighborsRegressor(n_neighbors=3, weights=weighting).fit(x, y)
        np.testing.assert_allclose(res.preds[0, b, t].item(), ref.predict(xs[b, t][None].numpy())[0], rtol=1e-9)
        np.testing.assert_allclose(res.query_preds[0, b, t].numpy(), ref.predict(queries[b].numpy()), rtol=1e-9)


def test_averaging(prompts):
    xs, ys = prompts
    w = run_learner("averaging", xs, ys).weights[0]
    np.testing.assert_allclose(w[2, 4].numpy(), (ys[2, :4, None] * xs[2, :4]).mean(0).numpy())


def test_registry_errors(prompts):
    xs, ys = prompts
    with pytest.raises(ConfigError, match=r"Unknown learner 'newtn'\. Did you mean: newton\?"):
        run_learner("newtn", xs, ys)
    with pytest.raises(ConfigError, match=r"learner 'gd' has no hyper-parameter \['iters'\]"):
        run_learner("gd", xs, ys, iters=(1,))
    with pytest.raises(ConfigError, match="alpha=.huge. is not a number or one of"):
        run_learner("newton", xs, ys, alpha=("huge",))
    with pytest.raises(ConfigError, match=r"ys must have shape \(6, 10\)"):
        run_learner("gd", xs, ys[:, :3])
    assert {"least_squares", "ridge", "gd", "newton", "ogd", "sgd", "adam", "cg", "bfgs", "lbfgs",
            "online_least_squares", "knn", "averaging"} <= set(LEARNERS.names())


def test_learners_run_on_the_requested_device(prompts):
    xs, ys = prompts
    res = run_learner("newton", xs.to("cpu"), ys, iterations=(1,))
    assert res.weights.device.type == "cpu"


# ---------------------------------------------------------------- inexact (Wolfe) line searches

SCIPY_METHOD = {"bfgs": "BFGS", "cg": "CG", "lbfgs": "L-BFGS-B"}


def _scipy_iterates(x, y, method, n_iter, memory):
    import warnings

    s, rhs = x.T @ x, x.T @ y
    seen = []
    options = {"maxiter": n_iter, **({"maxcor": memory} if method == "L-BFGS-B" else {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scipy.optimize.minimize(lambda w: 0.5 * w @ s @ w - rhs @ w, np.zeros(x.shape[1]), jac=lambda w: s @ w - rhs,
                                method=method, callback=lambda xk: seen.append(np.array(xk)), options=options)
    return seen


@pytest.mark.parametrize("name", ["bfgs", "cg", "lbfgs"])
def test_wolfe_iterates_equal_scipy_minimize(name):
    """Seed 004's CG / BFGS / L-BFGS as practical codes run them: every one of the first 5
    iterates equals scipy.optimize.minimize's on the same least-squares objective."""
    p = sample_prompts(TaskConfig(n_dims=4, n_points=12), 8, generator=generator_for(3))
    xs, ys = p.xs.double(), p.ys.double()
    res = run_learner(name, xs, ys, iterations=range(6), line_search="wolfe", **({"memory": 5} if name == "lbfgs" else {}))
    compared = 0
    for b, t, x, y in _prefixes(xs, ys):
        if t == 0:
            continue
        for k, ref in enumerate(_scipy_iterates(x, y, SCIPY_METHOD[name], 5, 5)[:5], start=1):
            np.testing.assert_allclose(res.weights[k, b, t].numpy(), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
            compared += 1
    assert compared > 200


@pytest.mark.slow
def test_wolfe_searches_differ_between_methods_and_agree_with_exact_at_convergence(prompts):
    xs, ys = prompts
    def second(name, search):
        return run_learner(name, xs, ys, iterations=(2,), line_search=search).weights[0, :, 6:]

    # exact searches make CG and BFGS coincide on a quadratic; scipy's inexact ones do not
    torch.testing.assert_close(second("cg", "exact"), second("bfgs", "exact"), rtol=1e-8, atol=1e-10)
    assert (second("cg", "wolfe") - second("bfgs", "wolfe")).abs().max() > 1e-3
    ls = run_learner("least_squares", xs, ys).weights[0, :, 5:]
    for name in ("cg", "bfgs", "lbfgs"):
        for search in ("exact", "wolfe"):
            torch.testing.assert_close(run_learner(name, xs, ys, iterations=(60,), line_search=search).weights[0, :, 5:],
                                       ls, rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore:The line search algorithm")
def test_batched_line_searches_equal_scipys():
    """The batched Moré-Thuente search equals scipy's DCSRCH, and the batched Alg. 3.5/3.6 equals
    scipy's scalar_search_wolfe2, on random one-dimensional problems (quadratic and quartic)."""
    from scipy.optimize._dcsrch import DCSRCH
    from scipy.optimize._linesearch import scalar_search_wolfe2

    from probe.learners.line_search import more_thuente, wolfe2

    g = np.random.default_rng(0)
    n = 300
    f0, d0 = g.normal(size=n), -np.abs(g.normal(size=n)) * 10 ** g.uniform(-2, 2, n)
    c, e = np.abs(g.normal(size=n)) * 10 ** g.uniform(-2, 2, n), np.where(g.uniform(size=n) < 0.5, 0.0, g.uniform(size=n))
    a0 = 10 ** g.uniform(-3, 3, n)
    phi = [lambda a, i=i: f0[i] + d0[i] * a + 0.5 * c[i] * a * a + 0.25 * e[i] * a**4 for i in range(n)]
    dphi = [lambda a, i=i: d0[i] + c[i] * a + e[i] * a**3 for i in range(n)]
    F0, D0, C, E = (torch.tensor(v) for v in (f0, d0, c, e))

    def batched(a):
        return F0 + D0 * a + 0.5 * C * a * a + 0.25 * E * a**4, D0 + C * a + E * a**3

    def batched_all(a, index):  # the steps of the elements `index`, evaluated in place
        full = torch.ones(n, dtype=torch.float64)
        full[index] = a
        return batched(full)

    ours = more_thuente(lambda a, i: tuple(v[i] for v in batched_all(a, i)), F0, D0, torch.tensor(a0), ftol=1e-4, gtol=0.4, xtol=1e-14, stpmin=1e-100, stpmax=1e100)
    ref = [DCSRCH(phi[i], dphi[i], 1e-4, 0.4, 1e-14, 1e-100, 1e100)(a0[i], phi0=f0[i], derphi0=d0[i])[0] for i in range(n)]
    assert ours.ok.all() and all(r is not None for r in ref)
    np.testing.assert_allclose(ours.step.numpy(), ref, rtol=1e-8)
    assert (np.abs(np.array(ref) - a0) > 1e-6 * a0).sum() > 50  # most searches took more than one trial

    ours2 = wolfe2(batched, lambda a: torch.ones_like(a, dtype=torch.bool), F0, D0, torch.ones(n, dtype=torch.float64),
                   c1=1e-4, c2=0.9, amax=1e100)
    ref2 = [scalar_search_wolfe2(phi[i], dphi[i], f0[i], None, d0[i], c1=1e-4, c2=0.9, amax=1e100)[0] for i in range(n)]
    found = np.array([r is not None for r in ref2])
    assert np.array_equal(ours2.ok.numpy(), found) and found.mean() > 0.9
    np.testing.assert_allclose(ours2.step.numpy()[found], np.array([r for r in ref2 if r is not None]), rtol=1e-8)


def test_unknown_line_search_is_refused(prompts):
    xs, ys = prompts
    with pytest.raises(ConfigError, match=r"line_search='armijo' must be one of \['exact', 'wolfe'\]"):
        run_learner("bfgs", xs, ys, line_search="armijo")


def test_eigendecomposition_is_shared_split_and_weights_formed_on_read():
    """batched_eigh equals torch.linalg.eigh bit for bit; GD after Newton on the same tensors reuses
    the decomposition (and recomputes after an in-place change); the lazily formed weights predict
    what the rotated-input predictions say."""
    from probe.learners import iterative

    g = torch.Generator().manual_seed(5)
    s = torch.randn(37, 6, 6, generator=g, dtype=torch.float64)
    s = s @ s.transpose(1, 2)
    lam, v = iterative.batched_eigh(s)
    ref = torch.linalg.eigh(s)
    assert torch.equal(lam, ref[0]) and torch.equal(v, ref[1])
    xs, ys = torch.randn(8, 9, 3, generator=g, dtype=torch.float64), torch.randn(8, 9, generator=g, dtype=torch.float64)
    calls = []
    original = iterative.batched_eigh
    iterative.LAST_PROMPTS.clear()
    try:
        iterative.batched_eigh = lambda m: calls.append(1) or original(m)
        newton = run_learner("newton", xs, ys, iterations=(0, 5))
        gd = run_learner("gd", xs, ys, steps=(0, 4))
        assert len(calls) == 1
        xs.mul_(1.0)  # an in-place write: a new version, decomposed again
        run_learner("gd", xs, ys, steps=(0, 4))
        assert len(calls) == 2
    finally:
        iterative.batched_eigh = original
    for res in (newton, gd):
        torch.testing.assert_close(torch.einsum("kbnd,bnd->kbn", res.weights, xs), res.preds, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "name, grid",
    [
        ("least_squares", {}),
        ("ridge", {"lam": (0.1, 1.0)}),
        ("gd", {"steps": (0, 8), "eta": ("auto", 0.05)}),
        ("newton", {"iterations": (0, 4), "alpha": ("spectral", 0.5)}),
        ("ogd", {}),
        ("sgd", {"steps": (8,), "eta": (0.02,), "batch_size": (4,), "masks_seed": 0}),
        ("lsa_optimum", {"n_train": (5, 20)}),
    ],
)
def test_last_prefix_is_the_full_runs_last_prefix(name, grid):
    # the order stage asks for the query's prefix alone: the closed-form and spectral learners
    # decompose that prefix only, the others are sliced; the predictions and weights are those of
    # the full run bit for bit (query predictions to round-off: their products are batched otherwise)
    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(40, 9, 4, generator=g, dtype=torch.float64), torch.randn(40, 9, generator=g, dtype=torch.float64)
    queries = torch.randn(40, 3, 4, generator=g, dtype=torch.float64)
    full = run_learner(name, xs, ys, queries, **grid)
    last = run_learner(name, xs, ys, queries, last_prefix=True, **grid)
    assert LEARNERS.get(name).last_prefix == (name in ("least_squares", "ridge", "gd", "newton", "lsa_optimum"))
    assert last.preds.shape == (*full.preds.shape[:2], 1) and last.grid == full.grid
    assert torch.equal(last.preds, full.preds[..., -1:])
    assert torch.equal(last.weights, full.weights[:, :, -1:])
    torch.testing.assert_close(last.query_preds, full.query_preds[:, :, -1:], rtol=1e-12, atol=1e-12)


SERIAL_LAPACK = """
import sys, torch
from probe.analysis.ridge import cholesky_solve, lower_solve, upper_solve
fns = {"herm": lambda m: torch.linalg.pinv(m, hermitian=True, rtol=1e-10), "pinv": torch.linalg.pinv,
       "eigh": torch.linalg.eigh, "cholesky_ex": torch.linalg.cholesky_ex, "cholesky_solve": cholesky_solve,
       "lower_solve": lower_solve, "upper_solve": upper_solve}
cases = torch.load(sys.argv[1])
out = [fns[name](*args) for name, args in cases]
torch.save([tuple(r) if isinstance(r, tuple) else r for r in out], sys.argv[2])
"""


def test_per_matrix_threads_give_the_one_thread_call_bit_for_bit_at_any_thread_count(tmp_path, monkeypatch):
    # least squares' pseudo-inverses, the span test's projectors, GD/Newton's eigendecompositions and
    # the probes' ridge factorisations run their batch split over threads of one OpenMP thread each
    # (probe/core/threads.py): the numbers are the batched call's in a one-thread process, whatever the count
    import os
    import subprocess
    import sys
    from pathlib import Path

    from probe.analysis.ridge import cholesky_solve, lower_solve, upper_solve
    from probe.core.threads import per_matrix

    g = torch.Generator().manual_seed(8)
    xs = torch.randn(6, 7, 9, 4, generator=g, dtype=torch.float64)
    s = xs.transpose(-1, -2) @ xs
    s[0, 0] = 0.0  # rank 0 and rank-deficient (t < d) matrices included
    low = xs[:, :, :2].transpose(-1, -2) @ xs[:, :, :2]  # (6, 7, 4, 4) of rank 2
    wide = torch.randn(5, 300, 128, generator=g, dtype=torch.float64)
    big = wide.transpose(1, 2) @ wide  # sides 128: LAPACK's threaded eigh differs from its serial one here
    chol = torch.linalg.cholesky(big)
    rhs = torch.randn(5, 128, 3, generator=g, dtype=torch.float64)
    fns = {"herm": lambda m: torch.linalg.pinv(m, hermitian=True, rtol=1e-10), "pinv": torch.linalg.pinv,
           "eigh": torch.linalg.eigh, "cholesky_ex": torch.linalg.cholesky_ex, "cholesky_solve": cholesky_solve,
           "lower_solve": lower_solve, "upper_solve": upper_solve}  # fmt: skip
    cases = [("herm", (s,)), ("herm", (low,)), ("pinv", (xs,)), ("eigh", (s,)), ("eigh", (big,))]
    cases += [("cholesky_ex", (big,)), ("cholesky_solve", (chol, rhs)), ("lower_solve", (chol, rhs))]
    cases += [("upper_solve", (chol.transpose(1, 2), rhs))]
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-c", SERIAL_LAPACK, str(tmp_path / "cases.pt"), str(tmp_path / "serial.pt")]
    subprocess.run(command, check=True, env=env, cwd=Path(__file__).resolve().parents[1])
    serial = torch.load(tmp_path / "serial.pt")
    for threads in (2, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=threads: n)
        for (name, args), expected in zip(cases, serial):
            threaded = per_matrix(fns[name], *args)
            for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (threaded, expected))):
                assert a.shape == b.shape and torch.equal(a, b), (name, threads)


@pytest.mark.parametrize("name", ["least_squares", "gd", "newton", "ridge"])
def test_prompts_that_would_overflow_the_learners_are_refused_naming_the_scale(name):
    """Float64 prompts at 1e200 overflowed S = sum x x^T into a raw LinAlgError from eigh."""
    from probe.core.errors import ConfigError

    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(4, 8, 3, dtype=torch.float64, generator=g), torch.randn(4, 8, dtype=torch.float64, generator=g)
    with pytest.raises(ConfigError, match=r"prompts reach \|value\| .*e\+200.*rescale the prompts$"):
        run_learner(name, xs * 1e200, ys * 1e200)
    with pytest.raises(ConfigError, match="or pass them as float64"):
        run_learner(name, (xs * 1e12).float(), (ys * 1e12).float())
    assert torch.isfinite(run_learner(name, xs * 1e6, ys * 1e6).preds).all()  # large but affordable: no refusal


def test_ridge_whose_penalty_vanishes_beside_huge_prompts_says_so():
    from probe.core.errors import ConfigError
    from probe.learners import run_learner

    g = torch.Generator().manual_seed(0)
    xs = torch.randn(4, 10, 5, generator=g, dtype=torch.float64) * 1e50
    ys = torch.randn(4, 10, generator=g, dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"ridge with lambda 0.01 is singular on these prompts: S = X\^T X reaches .*e\+10"):
        run_learner("ridge", xs, ys)
    assert torch.isfinite(run_learner("ridge", xs, ys, lam=(1e98,)).preds).all()  # a penalty at the data's scale


def test_per_matrix_runs_lapack_on_one_thread_per_worker_and_a_lone_matrix_in_place(monkeypatch):
    """No thread pool on top of LAPACK's own threads: every part of a split batch runs on a worker
    whose OpenMP (which MKL's LAPACK follows) has one thread, large matrices too; a batch of one
    matrix, one thread, or a tensor off the CPU is one call on the calling thread
    (probe/core/threads.py). The caller keeps its own OpenMP setting."""
    import threading

    from probe.core import threads
    from probe.core.threads import per_matrix

    openmp = threads._torch_openmp()
    if openmp is None:
        pytest.skip("torch has no bundled libgomp here: per_matrix does not split")
    monkeypatch.setattr(threads, "_POOLS", {})  # workers started in this test
    seen: list[tuple[int, int]] = []
    record = lambda m: seen.append((threading.get_ident(), openmp.omp_get_max_threads())) or m.clone()
    own = openmp.omp_get_max_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    per_matrix(record, torch.eye(300, dtype=torch.float64).expand(4, -1, -1).clone())
    assert len(seen) == 2 and all(ident != threading.get_ident() and n == 1 for ident, n in seen)
    assert openmp.omp_get_max_threads() == own  # the caller's own setting is untouched
    for lone in (torch.eye(300).unsqueeze(0), torch.eye(4).expand(3, 4, 4).to("meta")):
        seen.clear()
        per_matrix(record, lone)
        assert seen == [(threading.get_ident(), own)]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    seen.clear()
    per_matrix(record, torch.eye(4).expand(8, -1, -1).clone())
    assert seen == [(threading.get_ident(), own)]


@pytest.mark.slow
def test_large_batched_solves_still_work_after_the_lapack_workers_start():
    """torch 2.13's CPU build: once torch.set_num_threads(n > 1) has been called, MKL's batched LU of
    257 x 257 systems fails ("Pivots given to lu_solve ..."): the LAPACK workers
    (probe/core/threads.py) must not leave the process so. In a fresh process with torch's default
    threads, as a report runs (the test workers here run one thread each)."""
    import os
    import subprocess
    import sys

    code = (
        "import probe, torch\n"
        "from probe.core.threads import per_matrix\n"
        "g = torch.Generator().manual_seed(0)\n"
        "a = torch.randn(8, 13, 600, 257, dtype=torch.float64, generator=g)\n"
        "s, b = a.transpose(-1, -2) @ a, torch.randn(8, 13, 257, 1, dtype=torch.float64, generator=g)\n"
        "per_matrix(torch.linalg.eigh, s[0, :4, :8, :8].contiguous())\n"
        "x, info = torch.linalg.solve_ex(s, b)\n"
        "assert int(info.abs().sum()) == 0 and torch.allclose(s @ x, b, atol=1e-8), 'wrong solution'\n"
        "print(torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    command = [sys.executable, "-c", code]
    run = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    if int(run.stdout) < 2:
        pytest.skip("one CPU: per_matrix starts no workers")


def test_one_rule_for_a_hyper_parameter_wherever_it_is_given():
    """A learner's hyper-parameters are checked by one Rule (probe/core/validate.py),
    the same for a recipe's sweep, `run_learner` and a direct call of the learner's function; the
    settings fields use the same rules, and the budget counts the keys whose rule says iterations."""
    from probe.analysis.probe_study import ProbeSettings
    from probe.core.budget import ITERATION_KEYS
    from probe.core.settings import SweepSettings
    from probe.core.validate import GRID_RULES
    from probe.learners import check_sweep
    from probe.learners.iterative import gd

    xs, ys = torch.randn(2, 6, 3), torch.randn(2, 6)
    message = r"learner 'gd': steps must be an integer >= 0, got -1"
    with pytest.raises(ConfigError, match=message):
        gd(xs, ys, steps=[-1])
    with pytest.raises(ConfigError, match=message):
        run_learner("gd", xs, ys, steps=[-1])
    with pytest.raises(ConfigError, match=r"sweep 'g': steps must be an integer >= 0, got -1"):
        check_sweep(SweepSettings(label="g", learner="gd", grid={"steps": [-1]}), "sweep")
    with pytest.raises(ConfigError, match=r"probes.max_iter must be an integer >= 1, got 2.5"):
        ProbeSettings(max_iter=2.5)
    # a learner whose words differ declares its own rule: GD's step is "auto" or a number, OGD's "normalized"
    with pytest.raises(ConfigError, match=r"eta='normalized' is not a number or one of \['auto'\]"):
        gd(xs, ys, eta=["normalized"])
    assert run_learner("ogd", xs, ys, eta=["normalized"]).grid == [{"eta": "normalized"}]
    assert gd(xs, ys, steps=[2.0]).grid[0]["steps"] == 2  # normalised at the boundary, as in a recipe
    assert ITERATION_KEYS == tuple(key for key, rule in GRID_RULES.items() if rule.iterations) == (
        "steps",
        "iterations",
        "epochs",
    )
