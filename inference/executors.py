"""Where local fits run: in this process (one batched model) or on Dask distributed workers.

:func:`fit_local_on` is the entry point. Without ``workers`` or ``scheduler`` it is
:func:`pyrogp_models.inference.local_fit.fit_local`. Otherwise the partitions are cut into one
contiguous chunk per worker (about equal numbers of points); each worker receives only its chunk's
points and fits them as one batched model, returning module files as bytes, and the client
reassembles the modules under the names and in the order of the global partition.

Every chunk uses what the in-process fit would use: the standardisation of *all* the data (so the
modules can be recycled together) and the initial inducing inputs, both computed here on the
client. A per-partition objective and full-batch training make the partitions' trajectories
independent: the batched L-BFGS of the collapsed bound keeps one memory and one line search per
partition and stops each partition on its own test, so the distributed modules equal the
in-process ones to rounding. With Adam convergence is judged per chunk (on the chunk's summed
loss), so chunks may stop at other steps (``config.tol=None`` makes them equal); minibatch draws
are shared by the partitions of one batch, so there chunking changes the path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from pyrogp_models.inference.local_fit import (
    LocalFit,
    LocalFitSpec,
    PartitionedData,
    default_config,
    fit_local,
    local_predictor,
    model_inputs,
    seeded_generator,
    train_local,
)
from pyrogp_models.inference.trainer import TrainConfig, TrainResult

from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import Partition
from pyrogp_models.errors import PyrogpError
from pyrogp_models.models.local.local_gps import inducing_per_partition, initial_inducing
from pyrogp_models.modules.files import module_from_bytes, module_to_bytes
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module

#: Seconds to wait for a scheduler to answer and for its first worker.
CONNECT_TIMEOUT = 30


@dataclass
class DistributedFit:
    """Modules of a fit spread over Dask workers, in partition order.

    ``result`` merges the chunks' training records: ``losses`` is the summed loss of all chunks
    (a chunk that stopped keeps its last value), ``steps`` the longest chunk's, ``converged``
    whether every chunk converged. ``chunks`` lists the partition indices each worker fitted.
    The trained models stay on the workers; ``predictor`` serves the returned modules.
    """

    modules: dict[str, Module]
    partition: Partition
    result: TrainResult
    standardisation: Standardisation
    chunks: list[np.ndarray]

    @property
    def predictor(self) -> Predictor:
        return local_predictor(self.modules, self.partition)


@dataclass
class ChunkTask:
    """What one worker needs: its points (data units), their partition within the chunk and
    everything shared by the whole fit."""

    X: np.ndarray
    y: np.ndarray
    assignments: np.ndarray
    spec: LocalFitSpec  # with the chunk's names, M_k, initial Z and the shared standardisation
    config: TrainConfig


@dataclass
class ChunkResult:
    """One worker's answer: module files (bytes) in chunk order and its training record."""

    modules: list[bytes]
    losses: list[float]
    steps: int
    converged: bool


def fit_local_on(data: PartitionedData | tuple, spec: LocalFitSpec | None = None,
                 config: TrainConfig | None = None, *, workers: int | None = None,
                 scheduler: str | None = None) -> LocalFit | DistributedFit:
    """Fit in process (default), on an embedded cluster of ``workers`` single-threaded worker
    processes, or on the Dask cluster whose scheduler is at ``scheduler``."""
    if workers is None and scheduler is None:
        return fit_local(data, spec, config)
    with dask_client(workers, scheduler) as client:
        return fit_local_distributed(client, data, spec, config)


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None) -> Iterator:
    """A Dask client: of a new ``LocalCluster(n_workers=workers, threads_per_worker=1)``
    (closed on exit), or connected to the scheduler at ``scheduler``."""
    if (workers is None) == (scheduler is None):
        raise ValueError("give either a number of workers or a scheduler address")
    if workers is not None and workers < 1:
        raise ValueError(f"the number of workers must be at least 1, got {workers}")
    try:
        from distributed import Client, LocalCluster
    except ImportError as error:
        raise PyrogpError(f"distributed fits need dask[distributed] ({error})") from None
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except OSError as error:
            raise PyrogpError(f"cannot reach the Dask scheduler at {scheduler}: {error}") from None
        with client:
            client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
            yield client
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        yield client


def fit_local_distributed(client, data: PartitionedData | tuple,
                          spec: LocalFitSpec | None = None, config: TrainConfig | None = None
                          ) -> DistributedFit:
    """:func:`~pyrogp_models.inference.local_fit.fit_local` on the workers of a Dask ``client``, one
    chunk of partitions per worker (see the module docstring)."""
    spec = spec or LocalFitSpec()
    partition = data[2]
    addresses = sorted(client.nthreads())
    chunks, tasks, standardisation = chunk_tasks(data, len(addresses), spec, config)
    futures = []
    for task, address in zip(tasks, addresses, strict=False):
        scattered = client.scatter(task, workers=[address], hash=False)
        futures.append(client.submit(fit_chunk, scattered, workers=[address],
                                     allow_other_workers=True, pure=False))
    results: list[ChunkResult] = client.gather(futures)
    modules = {}
    for chunk, task, result in zip(chunks, tasks, results, strict=True):
        for k, name, module_bytes in zip(chunk.tolist(), task.spec.names, result.modules,
                                         strict=True):
            module = module_from_bytes(module_bytes, f"module '{name}' from a worker")
            modules[name] = replace(module, info={**module.info, "partition": k})
    return DistributedFit(modules, partition, _merge_results(results), standardisation, chunks)


def chunk_tasks(data: PartitionedData | tuple, num_chunks: int, spec: LocalFitSpec,
                config: TrainConfig | None = None
                ) -> tuple[list[np.ndarray], list[ChunkTask], Standardisation]:
    """The partitions cut into ``num_chunks`` runs (see :func:`split_partitions`), one task per
    run holding only that run's points, and the standardisation they share."""
    X, y, partition = data
    config = replace(config or default_config(spec), progress=False)  # as fit_local's
    if config.checkpoint is not None:
        raise ValueError("checkpoints are not supported by distributed fits")
    X_model, y_model, standardisation = model_inputs(X, y, spec)
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    num_partitions = partition.num_partitions
    width = max(3, len(str(num_partitions - 1)))
    names = list(spec.names or [f"part{k:0{width}d}" for k in range(num_partitions)])
    if len(names) != num_partitions:
        raise ValueError(f"{len(names)} names for {num_partitions} partitions")
    inducing = initial_inducing(X_model, y_model, partition, spec.num_inducing,
                                spec.inducing_init, seeded_generator(config, spec))
    per_partition = inducing_per_partition(partition, spec.num_inducing)
    info = {"partition_rule": partition.rule.get("kind"), **(spec.info or {})}
    chunks = split_partitions(partition.sizes, num_chunks)
    tasks = []
    for chunk in chunks:
        rows = np.isin(partition.assignments, chunk)
        chunk_spec = replace(spec, num_inducing=per_partition[chunk].tolist(),
                             names=[names[k] for k in chunk], info=info,
                             standardisation=standardisation,
                             inducing=[inducing[k] for k in chunk])
        tasks.append(ChunkTask(X[rows], y[rows], np.searchsorted(chunk,
                                                                 partition.assignments[rows]),
                               chunk_spec, config))
    return chunks, tasks, standardisation


def fit_chunk(task: ChunkTask) -> ChunkResult:
    """Run on a worker: fit one chunk single-threaded and return its modules as bytes."""
    torch.set_num_threads(1)
    partition = Partition(task.assignments, {"kind": "random",
                                             "num_partitions": len(task.spec.names)})
    _, result, modules, _ = train_local((task.X, task.y, partition), task.spec, task.config)
    return ChunkResult([module_to_bytes(m) for m in modules.values()], result.losses,
                       result.steps, result.converged)


def split_partitions(sizes: np.ndarray, num_chunks: int) -> list[np.ndarray]:
    """Partition indices cut into ``min(num_chunks, K)`` contiguous non-empty runs holding about
    equal numbers of points."""
    count = len(sizes)
    num_chunks = min(num_chunks, count)
    cumulative = np.cumsum(sizes)
    targets = cumulative[-1] * np.arange(1, num_chunks) / num_chunks
    cuts = np.searchsorted(cumulative, targets) + 1
    # Keep every run non-empty: cut j lies in [j, count - num_chunks + j] and cuts increase.
    cuts = np.clip(cuts, np.arange(1, num_chunks), count - num_chunks + np.arange(1, num_chunks))
    cuts = np.maximum.accumulate(cuts - np.arange(1, num_chunks)) + np.arange(1, num_chunks)
    return np.split(np.arange(count), cuts)


def _merge_results(results: Sequence[ChunkResult]) -> TrainResult:
    steps = max(result.steps for result in results)
    padded = [np.pad(result.losses, (0, steps - result.steps), mode="edge")
              for result in results]
    return TrainResult(losses=np.sum(padded, axis=0).tolist(),
                       converged=all(result.converged for result in results), steps=steps)
