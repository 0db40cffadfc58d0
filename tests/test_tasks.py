import numpy as np
import pytest
import torch

from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, input_transform, sample_prompts


def test_same_seed_same_prompts_and_streams_differ():
    task = TaskConfig(n_dims=3, n_points=5)
    a = sample_prompts(task, 4, generator=generator_for(1, 2))
    b = sample_prompts(task, 4, generator=generator_for(1, 2))
    c = sample_prompts(task, 4, generator=generator_for(1, 3))
    assert torch.equal(a.xs, b.xs) and torch.equal(a.ys, b.ys)
    assert not torch.equal(a.xs, c.xs)


def test_linear_labels_and_w_scale():
    task = TaskConfig(n_dims=4, n_points=6, w_scale=3.0)
    p = sample_prompts(task, 20000, generator=generator_for(0))
    torch.testing.assert_close(p.ys, torch.einsum("bnd,bd->bn", p.xs, p.w))
    assert p.w.var().item() == pytest.approx(9.0, rel=0.03)
    assert p.xs.var().item() == pytest.approx(1.0, rel=0.03)


def test_noise_variance():
    task = TaskConfig(n_dims=4, n_points=10, noise_std=0.5)
    p = sample_prompts(task, 20000, generator=generator_for(0))
    resid = p.ys - torch.einsum("bnd,bd->bn", p.xs, p.w)
    assert resid.var().item() == pytest.approx(0.25, rel=0.03)


def test_ill_conditioned_sigma_has_requested_kappa():
    task = TaskConfig(n_dims=6, n_points=4, covariance="ill_conditioned", kappa=100.0)
    a = input_transform(task, 50, generator_for(0))
    sigma = a.transpose(-1, -2) @ a
    eig = torch.linalg.eigvalsh(sigma.double())
    np.testing.assert_allclose((eig[:, -1] / eig[:, 0]).numpy(), 100.0, rtol=1e-4)  # float32 Q
    # the empirical covariance of many draws from one prompt's Sigma approaches it
    z = torch.randn(200000, 6, generator=generator_for(5))
    x = z @ a[0]
    emp = torch.linalg.eigvalsh(torch.cov(x.T).double())
    assert (emp[-1] / emp[0]).item() == pytest.approx(100.0, rel=0.1)
    # bases differ between prompts (random orthogonal basis per prompt)
    assert not torch.allclose(sigma[0], sigma[1])


def test_sparse_w_has_exactly_k_nonzeros():
    task = TaskConfig(name="sparse_linear_regression", n_dims=8, n_points=5, sparsity=3)
    p = sample_prompts(task, 100, generator=generator_for(0))
    assert ((p.w != 0).sum(-1) == 3).all()


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.7, 0.3), (0.5, 0.5)])
def test_mixture_weights(weights):
    task = TaskConfig(name="relu_network", n_dims=5, n_points=50, mixture_weights=weights)
    p = sample_prompts(task, 400, generator=generator_for(0))
    frac_positive = (p.xs.mean(-1) > 0).float().mean().item()  # centre +2 vs -2 is unmistakable with d=5
    assert frac_positive == pytest.approx(weights[1], abs=0.01)


def test_relu_network_shift_and_forward():
    task = TaskConfig(name="relu_network", n_dims=3, n_points=4, relu_depth=3, relu_width=5, param_mean=0.5)
    p = sample_prompts(task, 3000, generator=generator_for(0))
    v1 = p.params["layer0"]
    assert v1.shape == (3000, 5, 3)
    assert (v1 * 3**0.5).mean().item() == pytest.approx(0.5, abs=0.02)
    # forward by hand for one prompt
    x = p.xs[0]
    h = torch.relu(x @ p.params["layer0"][0].T)
    h = torch.relu(h @ p.params["layer1"][0].T)
    y = (h @ p.params["layer2"][0].T).squeeze(-1)
    torch.testing.assert_close(p.ys[0], y)


def test_curriculum_zeroes_inactive_dims_before_labels():
    task = TaskConfig(n_dims=5, n_points=6)
    p = sample_prompts(task, 10, generator=generator_for(0), active_dims=2)
    assert (p.xs[:, :, 2:] == 0).all()
    torch.testing.assert_close(p.ys, torch.einsum("bnd,bd->bn", p.xs[:, :, :2], p.w[:, :2]))


def test_a_draw_no_machine_holds_is_refused_naming_the_count():
    """10^10 prompts reached torch's allocator (a RuntimeError from deep inside it) through
    probe.api.prompts; the draw is refused first, with its own count and the fix."""
    from probe import api
    from probe.core.errors import ConfigError

    task = TaskConfig(n_dims=4, n_points=16)
    with pytest.raises(ConfigError, match=r"^10000000000 prompts of 16 points \(d = 4\) would need .*; draw fewer prompts"):
        api.prompts(n=10**10, task=task)
    assert api.prompts(n=3, task=task)[0].shape == (3, 16, 4)


@pytest.mark.parametrize("scale", [{"noise_std": 1e300}, {"w_scale": 1e300}])
def test_prompts_that_overflow_float32_are_refused_naming_the_task_scales(scale):
    """Labels beyond float32's range were refused downstream as "ys contains NaN or infinite values;
    drop or fix those prompts" (prompts the user never gave)."""
    from probe.core.errors import ConfigError

    task = TaskConfig(n_dims=3, n_points=5, **scale)
    with pytest.raises(ConfigError, match=r"^linear_regression prompts overflow float32 .*: lower the task's scales$"):
        sample_prompts(task, 4, generator=generator_for(0))
