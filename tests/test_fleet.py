"""Fleet replay (replay/fleet/run.py): routing by hand, exactness against single-engine replays, the
store's `fleets` rows and `kvcap fleet --json`."""
import numpy as np
import polars as pl
import pytest

from capacity_helpers import CONV, kvcap_json
from replay.config import EngineConfig
from replay.engine import compiled
from replay.fleet.routing import ring_assign, session_keys, static_assignment
from replay.fleet.run import replay_fleet
from replay.run import replay
from traces.schema import SCHEMA

TABLES = ("requests", "steps", "events", "stalls", "tbt")
needs_core = pytest.mark.skipif(compiled.CORES["v1"] is None or compiled.CORES["v0"] is None,
                                reason="compiled cores not built")


def trace(arrival, prompt, output, *, prefix=None, tenant=None) -> pl.DataFrame:
    n = len(arrival)
    return pl.DataFrame({
        "request_id": np.arange(n), "arrival_s": np.asarray(arrival, float),
        "prompt_tokens": prompt, "output_tokens": output, "priority": [0] * n,
        "tenant": tenant or [None] * n, "prefix_hashes": prefix or [None] * n,
    }, schema=SCHEMA)


def mooncake(n: int) -> pl.DataFrame:
    from traces.loaders import load_trace
    return load_trace(CONV.with_name("conversation_trace.jsonl")).head(n)


def same_tables(a, b) -> None:
    for name in TABLES:
        x, y = a.tables()[name].drop("run_id"), b.tables()[name].drop("run_id")
        assert x.equals(y), name


def test_round_robin_by_hand():
    t = trace([0, 1, 2, 3, 4, 5, 6], [100] * 7, [5] * 7)
    f = replay_fleet(t, EngineConfig(), replicas=3, router="rr")
    assert f.assignment.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert [r.requests["request_id"].to_list() for r in f.replicas] == [[0, 3, 6], [1, 4], [2, 5]]
    tables = f.tables()
    assert tables["requests"].sort("request_id")["replica"].to_list() == [0, 1, 2, 0, 1, 2, 0]
    assert tables["runs"]["run_id"].to_list() == [f.fleet_id]
    assert len({r.run_id for r in f.replicas}) == 3


@needs_core
def test_least_outstanding_by_hand():
    # Request 0 decodes 2,000 tokens (~12 s on an H100); request 1 is short and done long before
    # t = 8, when replica 0 still serves request 0 and replica 1 is empty: lor sends request 2 there,
    # round robin would send it to replica 0.
    t = trace([0.0, 0.01, 8.0], [500, 500, 500], [2000, 2, 5])
    f = replay_fleet(t, EngineConfig(), replicas=2, router="lor")
    req = f.tables()["requests"].sort("request_id")
    assert req["finish_s"][1] < 8.0 < req["finish_s"][0]
    assert f.assignment.tolist() == [0, 1, 1]
    assert replay_fleet(t, EngineConfig(), replicas=2, router="rr").assignment.tolist() == [0, 1, 0]
    # Ties go to the lowest index; requests arriving together are counted as they are routed.
    together = trace([0.0, 0.0, 0.0, 0.0], [100] * 4, [50] * 4)
    assert replay_fleet(together, EngineConfig(), replicas=3,
                        router="lor").assignment.tolist() == [0, 1, 2, 0]


def test_prefix_affinity_and_consistent_hashing():
    keys = [[7, 1], [9], [7, 2], None, [9, 3], [7]]
    t = trace(range(6), [600] * 6, [5] * 6, prefix=[k and [np.uint64(x) for x in k] for k in keys],
              tenant=[None, None, None, "acme", None, None])
    a = static_assignment(t, 4, "prefix")
    assert a[0] == a[2] == a[5] and a[1] == a[4]      # same first prefix hash, same replica
    k = session_keys(t)
    assert k[0] == 7 and k[1] == 9
    # Adding a replica moves only keys to the new replica (consistent hashing).
    many = np.arange(10_000, dtype=np.uint64) * np.uint64(2654435761)
    four, five = ring_assign(many, 4), ring_assign(many, 5)
    moved = four != five
    assert moved.any() and (five[moved] == 4).all()
    assert 0.1 < moved.mean() < 0.35                  # about 1/5 of the keys


@needs_core
@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_one_replica_is_the_single_engine(scheduler):
    t = mooncake(150)
    cfg = EngineConfig(scheduler=scheduler, num_gpu_blocks_override=1200,
                       enable_prefix_caching=True)
    single = replay(t, cfg)
    for router in ("lor", "rr", "prefix"):
        same_tables(replay_fleet(t, cfg, replicas=1, router=router).replicas[0], single)


@needs_core
@pytest.mark.parametrize("scheduler,router", [("v1", "rr"), ("v0", "prefix")])
def test_stepping_equals_whole_replays(scheduler, router):
    """lor's way of driving replicas (stepping each core up to every arrival, rows written as
    they are routed) gives bit-identical tables to replaying each replica's share to the end."""
    t = mooncake(300)
    cfg = EngineConfig(scheduler=scheduler, num_gpu_blocks_override=900,
                       enable_prefix_caching=True)
    whole = replay_fleet(t, cfg, replicas=3, router=router)
    stepped = replay_fleet(t, cfg, replicas=3, router=router, stepped=True)
    assert (whole.assignment == stepped.assignment).all()
    assert sum(r.tables()["events"].height for r in whole.replicas) > 0   # preemption exercised
    for a, b in zip(whole.replicas, stepped.replicas):
        assert a.run_id == b.run_id
        same_tables(a, b)


def test_bad_router_and_replicas():
    t = trace([0.0], [10], [2])
    with pytest.raises(ValueError, match="--router"):
        replay_fleet(t, replicas=2, router="random")
    with pytest.raises(ValueError, match="--replicas"):
        replay_fleet(t, replicas=0, router="rr")


@needs_core
def test_cli_fleet_json_and_store(tmp_path):
    from replay.results.store import read_table
    src = tmp_path / "t.parquet"
    from traces.loaders import write_trace
    write_trace(mooncake(120), src)
    db = tmp_path / "f.duckdb"
    out = kvcap_json("fleet", src, "--replicas", "2", "--router", "lor", "--db", db,
                     "--num-gpu-blocks-override", "1500")
    assert {"ttft_p99_s", "tbt_p99_s", "meets_slo", "replicas"} <= out.keys()
    assert out["replicas"] == 2 and sum(out["replica_requests"]) == 120
    fleets = read_table(db, "fleets")
    assert fleets["replica"].to_list() == [0, 1] and fleets["fleet_id"].unique().len() == 1
    req = read_table(db, "requests").join(fleets, on="run_id")
    assert req.height == 120 and req["replica"].value_counts().height == 2
    fin = req.filter(pl.col("status") == "finished")
    lat = np.sort((fin["first_token_s"] - fin["arrival_s"]).to_numpy())
    assert out["ttft_p99_s"] == pytest.approx(lat[int(np.ceil(0.99 * len(lat))) - 1])
    kvcap_json("fleet", src, "--replicas", "2", "--router", "lor", "--db", db,
               "--num-gpu-blocks-override", "1500")
    assert read_table(db, "requests").height == 120        # a rerun replaces itself


@needs_core
def test_a_stuck_replica_waits_for_its_next_arrival():
    """V0 swap on a 300-block pool with Mooncake's long prompts: a swapped-out request that can
    never swap back in (it needs all but the watermark of the pool) stalls the engine, as it
    stalls vLLM. A stepped replica in that state jumped its clock to its next row, not routed
    yet (+inf), and `kvcap report` crashed ("went idle with work it could not move"); it now
    waits for that row, bit-identical to replaying its share whole."""
    t = mooncake(200)
    cfg = EngineConfig(scheduler="v0", model="mistral-7b", gpu="a100-80gb",
                       num_gpu_blocks_override=300, preemption_mode="swap", swap_space=1.0)
    whole = replay_fleet(t, cfg, replicas=3, router="rr")
    assert sum(int((r.tables()["requests"]["status"] == "unfinished").sum())
               for r in whole.replicas) > 0                     # the stall is exercised
    stepped = replay_fleet(t, cfg, replicas=3, router="rr", stepped=True)
    for a, b in zip(whole.replicas, stepped.replicas):
        same_tables(a, b)
    assert replay_fleet(t, cfg, replicas=3, router="lor").assignment.shape == (200,)
