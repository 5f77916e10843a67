"""Batched k-means and inducing-input initialisation."""

import pytest
import torch

from pyrogp_models.data.inducing import init_inducing
from pyrogp_models.data.kmeans import kmeans, kmeans_assign, kmeans_init, lloyd
from pyrogp_models.errors import DataError

BLOB_CENTRES = torch.tensor(
    [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]], dtype=torch.float64
)


def make_blobs(points_per_blob: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    noise = 0.3 * torch.randn(
        len(BLOB_CENTRES), points_per_blob, 2, generator=generator, dtype=torch.float64
    )
    points = (BLOB_CENTRES.unsqueeze(1) + shift + noise).reshape(-1, 2)
    return points[torch.randperm(points.shape[0], generator=generator)]


def assert_matches_blobs(centres: torch.Tensor, shift: float = 0.0, tol: float = 0.2) -> None:
    truth = BLOB_CENTRES + shift
    distances = torch.cdist(truth, centres.to(truth.dtype))
    nearest = distances.argmin(dim=1)
    assert sorted(nearest.tolist()) == list(range(len(truth))), "two blobs share one centre"
    assert distances.min(dim=1).values.max() < tol


@pytest.mark.parametrize("seed", range(5))
def test_kmeans_recovers_separated_blob_centres(seed):
    points = make_blobs(60, seed)
    centres = kmeans(points, 4, generator=torch.Generator().manual_seed(seed))
    assert centres.shape == (4, 2)
    assert_matches_blobs(centres)


def test_kmeans_float32_with_a_large_offset():
    points = make_blobs(60, 0, shift=3.0e4).float()
    centres = kmeans(points, 4, generator=torch.Generator().manual_seed(0))
    assert centres.dtype == torch.float32
    assert_matches_blobs(centres.double(), shift=3.0e4, tol=0.3)


def pad(point_sets: list[torch.Tensor], fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(points.shape[0] for points in point_sets)
    padded = torch.full((len(point_sets), longest, 2), fill, dtype=torch.float64)
    mask = torch.zeros(len(point_sets), longest, dtype=torch.bool)
    for k, points in enumerate(point_sets):
        padded[k, : points.shape[0]] = points
        mask[k, : points.shape[0]] = True
    return padded, mask


def test_lloyd_batched_over_padded_sets_equals_each_set_alone():
    generator = torch.Generator().manual_seed(3)
    point_sets = [torch.randn(n, 2, generator=generator, dtype=torch.float64) for n in (40, 17, 29)]
    padded, mask = pad(point_sets, fill=1.0e6)  # far-away padding would pull any centre it joined
    start = torch.stack([points[:5] for points in point_sets])
    batched = lloyd(padded, start, mask, num_iters=50)
    for k, points in enumerate(point_sets):
        alone = lloyd(points, start[k], num_iters=50)
        torch.testing.assert_close(batched[k], alone, rtol=0, atol=1e-12)
        assert not torch.allclose(alone, start[k])  # the iterations did move the centres


def test_batched_kmeans_equals_each_separable_set_alone():
    point_sets = [make_blobs(n, seed) for seed, n in enumerate((30, 12, 21))]
    padded, mask = pad(point_sets, fill=-1.0e6)
    batched = kmeans(padded, 4, mask, generator=torch.Generator().manual_seed(0))
    assert batched.shape == (3, 4, 2)
    for k, points in enumerate(point_sets):
        alone = kmeans(points, 4, generator=torch.Generator().manual_seed(100 + k))
        torch.testing.assert_close(sort_rows(batched[k]), sort_rows(alone))
        assert_matches_blobs(batched[k], tol=0.4)


def sort_rows(centres: torch.Tensor) -> torch.Tensor:
    keys = centres[:, 0] * 1e3 + centres[:, 1]
    return centres[keys.argsort()]


def test_init_picks_distinct_real_points_and_never_padding():
    generator = torch.Generator().manual_seed(0)
    point_sets = [torch.randn(n, 2, generator=generator, dtype=torch.float64) for n in (9, 6)]
    padded, mask = pad(point_sets, fill=1.0e6)
    for seed in range(20):
        start = kmeans_init(padded, 6, mask, generator=torch.Generator().manual_seed(seed))
        for k, points in enumerate(point_sets):
            matches = (start[k].unsqueeze(1) == points.unsqueeze(0)).all(dim=-1)
            assert (matches.sum(dim=1) == 1).all()  # each centre is one real point
            assert matches.any(dim=0).sum() == 6  # and no point is used twice


def test_init_is_reproducible_with_the_same_generator_state():
    points = torch.randn(2, 50, 3, dtype=torch.float64)
    first = kmeans_init(points, 7, generator=torch.Generator().manual_seed(5))
    second = kmeans_init(points, 7, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, second)


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_init_depends_on_neither_the_default_dtype_nor_the_points_dtype(default):
    """A float64 fit started under the default float32 (a script, the CLI) picks the centres
    it picks under the default float64, and a float32 fit the same ones."""
    points = torch.randn(2, 50, 3, dtype=torch.float64)
    previous = torch.get_default_dtype()
    try:
        centres = []
        for dtype in (default, torch.float64 if default == torch.float32 else torch.float32):
            torch.set_default_dtype(dtype)
            for points_dtype in (torch.float64, torch.float32):
                centres.append(kmeans_init(points.to(points_dtype), 7,
                                           generator=torch.Generator().manual_seed(5)).double())
    finally:
        torch.set_default_dtype(previous)
    chosen = [torch.cdist(centre, points).argmin(-1) for centre in centres]   # which points
    assert all(torch.equal(chosen[0], other) for other in chosen[1:])


def test_repeated_points_still_give_distinct_centres():
    values = torch.tensor([0.0, 1.0, 5.0], dtype=torch.float64).repeat_interleave(20)
    centres = kmeans(values.unsqueeze(-1), 3, generator=torch.Generator().manual_seed(0))
    assert sorted(centres.flatten().tolist()) == [0.0, 1.0, 5.0]


def test_centre_without_points_keeps_its_position():
    points = torch.tensor([[0.0], [0.2], [1.0], [1.2]], dtype=torch.float64)
    start = torch.tensor([[0.0], [1.0], [100.0]], dtype=torch.float64)
    centres = lloyd(points, start)
    torch.testing.assert_close(centres, torch.tensor([[0.1], [1.1], [100.0]], dtype=torch.float64))


def test_assign_picks_the_nearest_centre():
    points = torch.tensor([[[0.0, 0.0], [3.0, 3.1], [2.9, 0.0]]])
    centres = torch.tensor([[[0.0, 0.0], [3.0, 0.0], [3.0, 3.0]]])
    assert kmeans_assign(points, centres).tolist() == [[0, 2, 1]]


def test_too_few_real_points_is_a_data_error():
    padded, mask = pad([torch.randn(10, 2), torch.randn(3, 2)], fill=0.0)
    with pytest.raises(DataError, match="at least 4 real points.*smallest has 3"):
        kmeans(padded, 4, mask)


def test_grid_inducing_in_one_dimension_spans_each_partition():
    padded, mask = pad(
        [torch.tensor([[2.0, 0.0], [5.0, 0.0], [3.0, 0.0]]), torch.tensor([[-1.0, 0.0]] * 2)],
        fill=100.0,
    )
    Z = init_inducing(padded[..., :1], 4, mask, method="grid")
    assert Z.shape == (2, 4, 1)
    torch.testing.assert_close(Z[0, :, 0], torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=Z.dtype))
    torch.testing.assert_close(Z[1, :, 0], torch.full((4,), -1.0, dtype=Z.dtype))


def test_grid_inducing_in_two_dimensions_keeps_points_nearest_the_mean():
    corners = torch.tensor([[0.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 2.0], [1.0, 1.0]])
    Z = init_inducing(corners.unsqueeze(0), 5, method="grid")
    # 3 x 3 grid over [0, 2]^2; the 5 nearest to the mean (1, 1) are the centre and its 4 sides.
    expected = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [2.0, 1.0]])
    torch.testing.assert_close(Z[0], expected)


def test_grid_inducing_full_grid_when_the_count_is_a_power():
    points = torch.rand(3, 20, 2, dtype=torch.float64)
    Z = init_inducing(points, 9, method="grid")
    assert Z.shape == (3, 9, 2)
    lower, upper = points.amin(dim=1), points.amax(dim=1)
    torch.testing.assert_close(Z.amin(dim=1), lower)
    torch.testing.assert_close(Z.amax(dim=1), upper)
    assert all(torch.unique(Z[k, :, 0]).numel() == 3 for k in range(3))


def test_kmeans_inducing_keeps_dtype_and_stays_within_the_data():
    padded, mask = pad([torch.randn(30, 2), torch.randn(12, 2) + 5], fill=1.0e6)
    Z = init_inducing(padded.float(), 6, mask, generator=torch.Generator().manual_seed(0))
    assert Z.dtype == torch.float32 and Z.shape == (2, 6, 2)
    assert Z.abs().max() < 100


def test_unknown_inducing_method():
    with pytest.raises(ValueError, match="unknown inducing initialisation"):
        init_inducing(torch.zeros(1, 5, 1), 2, method="sobol")
