"""Variational expectations and predictive densities against quadrature, Monte Carlo and
closed forms computed independently."""

import math

import pytest
import torch

from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import (
    Bernoulli,
    Categorical,
    Gaussian,
    HeteroscedasticGaussian,
    Poisson,
    make_likelihood,
    quadrature,
)


def moments(n=50):
    return torch.randn(n) * 2, torch.rand(n) * 3 + 0.05


def test_gaussian_expectation_equals_quadrature():
    mean, var = moments()
    y = torch.randn(50) * 2
    lik = Gaussian(variance=0.37)
    analytic = lik.expected_log_prob(y, mean, var)
    numeric = quadrature.expectation(
        lambda f: torch.distributions.Normal(f, math.sqrt(0.37)).log_prob(y.unsqueeze(-1)),
        mean, var)
    assert torch.allclose(analytic, numeric, rtol=0, atol=1e-10)


def test_gaussian_predictive_is_normal_with_added_noise():
    mean, var = moments()
    y = torch.randn(50)
    expected = torch.distributions.Normal(mean, (var + 0.2).sqrt()).log_prob(y)
    assert torch.allclose(Gaussian(variance=0.2).log_predictive(y, mean, var), expected)


def test_bernoulli_logit_quadrature_matches_monte_carlo():
    """10⁶ stratified draws f = m + √v Φ⁻¹((i + ½)/n) give Monte Carlo error far below 1e-3;
    plain draws agree within four standard errors."""
    mean = torch.tensor([-2.0, -0.3, 0.0, 0.8, 3.0])
    var = torch.tensor([0.1, 1.0, 4.0, 2.5, 0.7])
    y = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    quad = Bernoulli(link="logit").expected_log_prob(y, mean, var)
    n = 10**6
    strata = torch.special.ndtri((torch.arange(n) + 0.5) / n).unsqueeze(-1)
    f = mean + var.sqrt() * strata
    stratified = torch.distributions.Bernoulli(logits=f).log_prob(y).mean(0)
    assert torch.allclose(quad, stratified, atol=1e-3)
    draws = mean + var.sqrt() * torch.randn(n, 5, generator=torch.Generator().manual_seed(1))
    log_probs = torch.distributions.Bernoulli(logits=draws).log_prob(y)
    standard_error = log_probs.std(0) / math.sqrt(n)
    assert ((quad - log_probs.mean(0)).abs() < 4 * standard_error).all()
    predictive = Bernoulli(link="logit").predictive_moments(mean, var)[0]
    assert torch.allclose(predictive, torch.sigmoid(f).mean(0), atol=1e-4)


def test_probit_predictive_closed_form_equals_quadrature():
    mean, var = moments()
    y = (torch.rand(50) < 0.5).double()
    closed = Bernoulli(link="probit").log_predictive(y, mean, var)
    sign = (2 * y - 1).unsqueeze(-1)
    numeric = quadrature.log_expectation(lambda f: torch.special.log_ndtr(sign * f), mean, var)
    assert torch.allclose(closed, numeric, atol=1e-6)
    prob = Bernoulli(link="probit").predictive_moments(mean, var)[0]
    assert torch.allclose(prob, torch.special.ndtr(mean / (1 + var).sqrt()), atol=1e-12)


def test_poisson_expectation_closed_form_equals_quadrature():
    mean, var = torch.randn(30), torch.rand(30) + 0.1
    y = torch.poisson(torch.full((30,), 3.0))
    closed = Poisson().expected_log_prob(y, mean, var)
    numeric = quadrature.expectation(
        lambda f: torch.distributions.Poisson(f.exp()).log_prob(y.unsqueeze(-1)), mean, var)
    assert torch.allclose(closed, numeric, atol=1e-8)
    rate, variance = Poisson().predictive_moments(mean, var)
    f = mean + var.sqrt() * torch.randn(4 * 10**5, 30)
    draws = torch.poisson(f.exp())
    assert torch.allclose(rate, draws.mean(0), rtol=0.05)
    assert torch.allclose(variance, draws.var(0), rtol=0.15)


def test_heteroscedastic_expectation_matches_monte_carlo():
    mean = torch.tensor([[0.3, -1.0], [1.0, 0.5], [-2.0, 0.0]])
    var = torch.tensor([[0.2, 0.3], [0.5, 0.1], [1.0, 0.4]])
    y = torch.tensor([0.0, 2.0, -1.0])
    lik = HeteroscedasticGaussian()
    draws = mean + var.sqrt() * torch.randn(10**6, 3, 2)
    monte_carlo = lik.distribution(draws).log_prob(y).mean(0)
    assert torch.allclose(lik.expected_log_prob(y, mean, var), monte_carlo, atol=5e-3)
    predictive_mc = lik.distribution(draws).log_prob(y).exp().mean(0).log()
    assert torch.allclose(lik.log_predictive(y, mean, var), predictive_mc, atol=5e-3)


@pytest.mark.parametrize("link", ["softmax", "robustmax"])
def test_categorical_matches_monte_carlo(link):
    mean = torch.tensor([[0.5, -0.2, 1.0], [-1.0, 2.0, 0.0]])
    var = torch.tensor([[0.3, 1.0, 0.5], [2.0, 0.1, 0.4]])
    y = torch.tensor([2.0, 1.0])
    lik = Categorical(num_classes=3, link=link, num_samples=20000)
    draws = mean + var.sqrt() * torch.randn(4 * 10**5, 2, 3)
    monte_carlo = lik.distribution(draws).log_prob(y).mean(0)
    assert torch.allclose(lik.expected_log_prob(y, mean, var), monte_carlo, atol=1e-2)
    probs, _ = lik.predictive_moments(mean, var)
    mc_probs = lik.distribution(draws).probs.mean(0)
    assert torch.allclose(probs, mc_probs, atol=1e-2)
    assert torch.allclose(probs.sum(-1), torch.ones(2), atol=1e-2)


def test_label_validation():
    with pytest.raises(DataError, match="0 or 1"):
        Bernoulli().validate_targets(torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(DataError, match="counts"):
        Poisson().validate_targets(torch.tensor([0.0, 1.5]))
    with pytest.raises(DataError, match="0..2"):
        Categorical(num_classes=3).validate_targets(torch.tensor([0.0, 3.0]))
    with pytest.raises(DataError, match="NaN"):
        Gaussian().validate_targets(torch.tensor([0.0, math.nan]))


def test_make_likelihood_by_name_and_batched_parameters():
    lik = make_likelihood("gaussian", (4,), variance=0.5)
    assert lik.variance.shape == (4,)
    mean, var = torch.zeros(4, 3), torch.ones(4, 3)
    assert lik.expected_log_prob(torch.zeros(4, 3), mean, var).shape == (4, 3)
    with pytest.raises(ValueError, match="unknown likelihood"):
        make_likelihood("student")


# Robust-max: class probabilities at very different class variances ---------------------------
RATIOS = [10.0**k for k in range(-4, 5)]


def robustmax_rows(ratio):
    """Latent moments [R, 3] where class 1's variance is ``ratio`` times class 0's."""
    mean = torch.tensor([[0.0, 0.0, 0.0], [0.5, -0.2, 1.0], [0.02, 0.0, -0.01],
                         [1.0, 0.0, -1.0], [-0.3, 0.4, 0.1], [0.0, 0.005, 2.0]])
    var = torch.tensor([[1e-2, 1e-2 * ratio, 1e-3], [1.0, ratio, 0.1]]).repeat(3, 1)
    return mean, var


@pytest.mark.parametrize("ratio", RATIOS)
def test_robustmax_equal_means_match_the_orthant_probability(ratio):
    # With equal means P(f_c is the max) = P(D_1 > 0, D_2 > 0) for D_j = f_c − f_j, a centred
    # bivariate normal with correlation ρ = v_c/√((v_c+v_j)(v_c+v_k)): P = 1/4 + asin(ρ)/(2π).
    var = torch.tensor([[1e-4, 1e-4 * ratio, 1.0], [1.0, ratio, 1e-4], [3.0, 3.0 * ratio, 3.0]])
    mean = torch.full_like(var, 0.7)
    lik = Categorical(num_classes=3, link="robustmax")
    expected = torch.empty_like(var)
    for c in range(3):
        j, k = [i for i in range(3) if i != c]
        rho = var[:, c] / ((var[:, c] + var[:, j]) * (var[:, c] + var[:, k])).sqrt()
        expected[:, c] = 0.25 + torch.asin(rho) / (2 * math.pi)
    prob_max = lik._prob_is_max(mean, var)
    assert torch.allclose(prob_max, expected, rtol=0, atol=1e-8)
    probs, _ = lik.predictive_moments(mean, var)
    assert torch.allclose(probs.sum(-1), torch.ones(3), rtol=0, atol=1e-8)


@pytest.mark.parametrize("ratio", RATIOS)
def test_robustmax_two_classes_match_the_closed_form(ratio):
    # P(f_0 > f_1) = Φ((m_0 − m_1)/√(v_0 + v_1)).
    mean = torch.tensor([[0.0, 0.0], [0.3, -0.1], [-0.02, 0.01], [2.0, 0.0]])
    var = torch.tensor([[1e-2, 1e-2 * ratio]]).expand(4, 2)
    lik = Categorical(num_classes=2, link="robustmax")
    prob_first = torch.special.ndtr((mean[:, 0] - mean[:, 1]) / var.sum(-1).sqrt())
    expected = torch.stack([prob_first, 1.0 - prob_first], -1)
    assert torch.allclose(lik._prob_is_max(mean, var), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("ratio", RATIOS)
def test_robustmax_probabilities_and_expectation_match_monte_carlo(ratio):
    mean, var = robustmax_rows(ratio)
    lik = Categorical(num_classes=3, link="robustmax")
    generator = torch.Generator().manual_seed(int(math.log10(ratio)) + 10)
    draws, wins = 10**6, torch.zeros_like(mean)
    for _ in range(5):
        f = mean + var.sqrt() * torch.randn((draws // 5, *mean.shape), generator=generator)
        wins += torch.nn.functional.one_hot(f.argmax(-1), 3).sum(0)
    win_rate = wins / draws
    # Standard errors, floored at one draw's worth for (almost) certain outcomes.
    se = (win_rate * (1 - win_rate) / draws).sqrt().clamp_min(1.0 / draws)
    off = lik.epsilon / 2
    mc_probs = (1 - lik.epsilon) * win_rate + off * (1 - win_rate)
    probs, _ = lik.predictive_moments(mean, var)
    assert torch.allclose(probs.sum(-1), torch.ones(len(mean)), rtol=0, atol=1e-6)
    assert ((probs - mc_probs).abs() <= 4 * (1 - lik.epsilon - off) * se).all()
    # E_q[log p(y|f)] for every label: the Monte Carlo mean of log p(y|f_s) is affine in the
    # win rate, with standard error |log(1−ε) − log off|·se.
    log_gap = math.log(1 - lik.epsilon) - math.log(off)
    for label in range(3):
        y = torch.full((len(mean),), float(label))
        mc = math.log(off) + log_gap * win_rate[:, label]
        expected_log_prob = lik.expected_log_prob(y, mean, var)
        assert ((expected_log_prob - mc).abs() <= 4 * log_gap * se[:, label]).all()
        assert torch.allclose(lik.log_predictive(y, mean, var), probs[:, label].log(),
                              rtol=1e-12, atol=0)


def test_robustmax_gradients_are_finite_and_match_finite_differences():
    lik = Categorical(num_classes=3, link="robustmax")
    mean = torch.tensor([[0.5, -0.2, 1.0], [0.0, 0.01, 0.0]], requires_grad=True)
    var = torch.tensor([[1e-4, 1.0, 0.3], [1e-2, 1e2, 1.0]], requires_grad=True)
    y = torch.tensor([0.0, 2.0])
    assert torch.autograd.gradcheck(lambda m, v: lik.expected_log_prob(y, m, v), (mean, var))
    # Zero variances (hard comparisons) and huge spreads: finite values and gradients.
    mean = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 30.0, -30.0]],
                        requires_grad=True)
    var = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1e-8, 1e6, 1e-8]], requires_grad=True)
    prob_max = lik._prob_is_max(mean, var)
    assert torch.allclose(prob_max.sum(-1), torch.ones(3), rtol=0, atol=1e-6)
    assert torch.allclose(prob_max[1], torch.tensor([1.0, 0.0, 0.0]), rtol=0, atol=1e-12)
    lik.expected_log_prob(torch.tensor([0.0, 1.0, 2.0]), mean, var).sum().backward()
    assert torch.isfinite(mean.grad).all() and torch.isfinite(var.grad).all()


def _constant_cases():
    """(name, targets, [the maximum-likelihood constant, constants around it]), each constant a
    (likelihood, f) with f one row's latent value(s) (a scalar, or one per latent function),
    repeated for every row."""
    generator = torch.Generator().manual_seed(0)
    y = torch.randn(40, generator=generator, dtype=torch.float64) * 1.7 + 0.3
    mean, spread = y.mean(), (y - y.mean()).square().mean()
    shifts = (-0.05, 0.05)
    gaussian = [(Gaussian(variance=float(spread * (1 + s)), dtype=torch.float64),
                 mean + m) for s in (0.0, *shifts) for m in (0.0, *shifts)]
    hetero = HeteroscedasticGaussian(dtype=torch.float64)
    heteroscedastic = [(hetero, torch.stack([mean + m, spread.log() + s]))
                       for s in (0.0, *shifts) for m in (0.0, *shifts)]
    labels = (torch.rand(40, generator=generator, dtype=torch.float64) < 0.3).double()
    rate = labels.mean()
    bernoulli = [[(Bernoulli(link=link, dtype=torch.float64), f + s)
                  for s in (0.0, *shifts)]
                 for link, f in (("logit", torch.logit(rate)),
                                 ("probit", torch.special.ndtri(rate)))]
    counts = torch.poisson(torch.full((40,), 3.2, dtype=torch.float64), generator=generator)
    poisson = [(Poisson(dtype=torch.float64), counts.mean().log() + s)
               for s in (0.0, *shifts)]
    classes = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 40, replacement=True,
                                generator=generator).double()
    frequencies = torch.bincount(classes.long(), minlength=3).double() / 40
    softmax = Categorical(num_classes=3, dtype=torch.float64)
    nudges = [torch.zeros(3)] + [s * torch.eye(3, dtype=torch.float64)[c]
                                 for c in range(3) for s in shifts]
    robustmax = Categorical(num_classes=3, link="robustmax", dtype=torch.float64)
    favourite = int(frequencies.argmax())
    winners = [favourite] + [c for c in range(3) if c != favourite]
    return [("gaussian", y, gaussian), ("heteroscedastic", y, heteroscedastic),
            ("bernoulli logit", labels, bernoulli[0]), ("bernoulli probit", labels, bernoulli[1]),
            ("poisson", counts, poisson),
            ("softmax", classes, [(softmax, frequencies.log() + nudge) for nudge in nudges]),
            ("robustmax", classes, [(robustmax, torch.eye(3, dtype=torch.float64)[c])
                                    for c in winners])]


@pytest.mark.parametrize("name, y, constants", _constant_cases(),
                         ids=[case[0] for case in _constant_cases()])
def test_the_constant_log_likelihood_is_the_best_constant_of_the_likelihoods_own_density(
        name, y, constants):
    """Likelihood.constant_log_likelihood equals Σ log p(y_n | f) of the likelihood's own
    distribution at the maximum-likelihood constant f, and every constant around it (or, for
    robust-max, every other winning class) scores less."""
    scores = [float(likelihood.distribution(f.expand(len(y), *f.shape)).log_prob(y).sum())
              for likelihood, f in constants]
    best_likelihood = constants[0][0]
    assert float(best_likelihood.constant_log_likelihood(y)) == pytest.approx(scores[0],
                                                                              rel=1e-12)
    assert max(scores[1:]) < scores[0]
