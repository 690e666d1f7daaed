"""`edge-agent bench` on the TensorRT backend (FakeTensorRT, FakeCudaDriver, FakeCudart): the
infer stage's CPU time per frame with CUDA graphs and without, on the phases' own agent."""

from __future__ import annotations

from fakes.trt_kit import UINT8_FMT, Fakes, swap_backend

from edge_agent.bench.phases import compare_graphs
from edge_agent.bench.report import format_report
from edge_agent.bench.single import run_bench
from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import load
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend


def fake_tensorrt(monkeypatch, fakes: Fakes) -> None:
    modules = (fakes.trt, fakes.cuda) if fakes.cudart is None else (fakes.trt, fakes.cuda, fakes.cudart)
    swap_backend(monkeypatch, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=modules))


def config(model, endpoint, tmp_path) -> AgentConfig:
    text = (
        f"model:\n  path: {model}\npublish:\n  endpoint: {endpoint}\n"
        f"backend:\n  type: tensorrt\n  cache_dir: {tmp_path / 'engines'}\n"
    )
    return load(AgentConfig, text, str(tmp_path / "bench.yaml"))


def test_bench_reports_the_infer_cpu_time_with_and_without_cuda_graphs(
    const_model, endpoint, tmp_path, monkeypatch
):
    fakes = Fakes(graphs=True)
    fake_tensorrt(monkeypatch, fakes)
    r = run_bench(config(const_model, endpoint, tmp_path), frames=40, source_fps=50, live_s=0.4)
    g = r["cuda_graphs"]
    assert g["replaying"] and g["off"] == ""
    assert g["plain_cpu_ms"]["count"] == g["graphs_cpu_ms"]["count"] == 100  # max(frames // 2, 100)
    for h in (g["plain_cpu_ms"], g["graphs_cpu_ms"]):
        assert 0 <= h["p50"] <= h["p99"] <= h["max"], h
    saving = g["plain_cpu_ms"]["p50"] - g["graphs_cpu_ms"]["p50"]
    assert abs(g["saving_p50_ms"] - saving) <= 0.0015, "the difference of the two p50s (rounded apart)"
    assert r["backend"]["cuda_graphs"]["replaying"], "the phases ran on graphs"
    names = [n for n, _ in fakes.calls]
    assert names.count("cudaGraphLaunch") >= 100 and "cudaStreamBeginCapture" in names
    line = next(x for x in format_report(r).splitlines() if "infer CPU (thread)" in x)
    assert f"CUDA graphs p50 {g['graphs_cpu_ms']['p50']:.3f} ms" in line and "(100 runs each)" in line


def test_the_comparison_runs_each_way_exactly_as_often_as_asked(const_model, tmp_path):
    fakes = Fakes(graphs=True)
    be = fakes.backend(tmp_path / "engines")
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    be.infer(io)  # captured
    mark = len(fakes.calls)
    g = compare_graphs(be, io, 12)
    calls = [n for n, _ in fakes.since(mark)]
    assert calls.count("cudaGraphLaunch") == 12 + 1, "12 replays, and compare_graphs' own first run"
    assert calls.count("IExecutionContext.execute_async_v3") == 12, "12 plain enqueues"
    assert g["graphs_cpu_ms"]["count"] == g["plain_cpu_ms"]["count"] == 12
    assert be.graph_state()["replaying"], "replay is back on afterwards"
    be.close()


def test_without_graphs_the_bench_gives_the_plain_figure_and_why(const_model, tmp_path):
    fakes = Fakes()  # no cuda-python
    be = fakes.backend(tmp_path / "engines")
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    g = compare_graphs(be, io, 12)
    assert not g["replaying"] and "cuda-python is not installed" in g["off"]
    assert g["plain_cpu_ms"]["count"] == 12 and g["graphs_cpu_ms"] is None and "saving_p50_ms" not in g
    be.close()
