"""The report tests' warehouses, built once a session: the tiny hand-written one (its
rows and the figures they give are in tests/helpers.py's ``build``), the gateway log with
hostile names replayed, the sweep with its capacity runs, and a run of one scenario beside one
of 100, the replays with an autoscaled scenario and pool, and the hand-written run with swap
preemption, speculative decoding and scheduler CPU time."""

from __future__ import annotations

import pytest

from pipeline.warehouse import Warehouse
from tests.helpers import (
    build,
    build_autoscaled,
    build_features,
    build_fleet,
    build_many,
    build_replayed,
    build_sweep,
)


@pytest.fixture(scope="session")
def replayed_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    tmp = tmp_path_factory.mktemp("replayed")
    return build_replayed(tmp / "wh", tmp / "logs")


@pytest.fixture(scope="session")
def tiny_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("tiny") / "wh")


@pytest.fixture(scope="session")
def sweep_warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str, str, str]:
    tmp = tmp_path_factory.mktemp("sweep")
    return build_sweep(tmp / "wh", tmp / "logs")


@pytest.fixture(scope="session")
def many_warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str, str]:
    tmp = tmp_path_factory.mktemp("many")
    return build_many(tmp / "wh", tmp / "logs")


@pytest.fixture(scope="session")
def fleet_warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str, str]:
    return build_fleet(tmp_path_factory.mktemp("fleet") / "wh")


@pytest.fixture(scope="session")
def autoscale_warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, str, str]:
    return build_autoscaled(tmp_path_factory.mktemp("autoscale") / "wh")


@pytest.fixture(scope="session")
def features_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build_features(tmp_path_factory.mktemp("features") / "wh")
