"""The bench's results as the text a terminal shows."""

from __future__ import annotations

from typing import Any


def _pq(h: dict[str, float]) -> str:
    return f"p50 {h['p50']:8.3f} ms   p99 {h['p99']:8.3f} ms   max {h['max']:8.3f} ms"


def _det(d: dict[str, Any]) -> str:
    return f"mean {d['mean']:.2f}, p50 {d['p50']:g}, max {d['max']} ({d['frames']} frames)"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``run_bench`` result."""
    adapted = r["input_adapter"]["adapted"]
    lines = _header_lines(r) + _phase_lines(r) + _host_lines(r["host"]) + _drift_lines(r)
    lines += _live_detail_lines(r["live"], r["budget"])
    bare = r.get("bare")
    if bare:
        lines += _bare_lines(bare, r["sequential"], r["live"], adapted)
    return "\n".join(lines)


def _frames_from(src: dict[str, Any]) -> str:
    """Where the frames came from, in words."""
    if src["type"] != "synthetic":
        kind = "image folder" if src["type"] == "images" else "video file"
        return f"{kind} {src['path']}: {src['frames']} frames preloaded ({src['mib']:g} MiB), looped"
    if src["config_source"] != "synthetic":
        return f"synthetic camera (in place of the config's {src['config_source']} source)"
    return "synthetic camera"


def _header_lines(r: dict[str, Any]) -> list[str]:
    """The model, the source, and the inference timed alone (with the input adapter's, if adapted)."""
    pure = r["pure_inference_ms"]
    h, w = r["model_input_hw"]
    backend = r["backend"]
    adapter = r["input_adapter"]
    lines = [
        f"model {r['model']} ({w}x{h}), {backend.get('backend')} {backend.get('providers', '')}",
        f"source: {_frames_from(r['source'])}",
        f"pure inference            {_pq(pure)}",
    ]
    if adapter["adapted"]:
        prefix, orig = adapter["prefix_ms"], adapter["original_inference_ms"]
        adapted = adapter["adapted_inference_ms"]
        lines += [
            f"  input adapter in the graph (Transpose + Cast, timed alone): {_pq(prefix)}",
            f"    whole model, alternating blocks (information only: the difference of two p50s is"
            f" noise): adapted p50 {adapted['p50']:.3f} ms, original p50 {orig['p50']:.3f} ms"
            f" ({adapted['count']} runs each)",
        ]
    graphs = r.get("cuda_graphs")
    if graphs:
        lines.append(_graphs_line(graphs))
    return [*lines, _budget_line(r["budget"])]


def _graphs_line(g: dict[str, Any]) -> str:
    """The infer stage's CPU time per frame, replaying CUDA graphs and enqueueing plainly."""
    plain = g["plain_cpu_ms"]
    if not g["replaying"]:
        return f"  infer CPU (thread) plain p50 {plain['p50']:.3f} ms; CUDA graphs off: {g['off']}"
    ours = g["graphs_cpu_ms"]
    return (
        f"  infer CPU (thread): CUDA graphs p50 {ours['p50']:.3f} ms, plain p50 {plain['p50']:.3f} ms,"
        f" saving {g['saving_p50_ms']:.3f} ms per frame ({ours['count']} runs each)"
    )


def _budget_line(b: dict[str, Any]) -> str:
    """Does inference alone fit the budget? The advice when it does not."""
    if b["advice"]:
        return f"budget: {b['advice']}"
    return (
        f"budget: inference p50 {_ms(b['inference_alone_p50_ms'])} alone,"
        f" {_ms(b['live_inference_p50_ms'])} live: fits the {b['budget_ms']:g} ms budget"
    )


def _step(phase: dict[str, Any], key: str) -> str:
    t = phase[key]
    return "off (no step runs)" if t is None else _pq(t)


def _phase_lines(r: dict[str, Any]) -> list[str]:
    """The sequential, pipelined and live phases' headline figures, and the live overhead."""
    seq, pipe, live = r["sequential"], r["pipelined"], r["live"]
    adapter = r["input_adapter"]
    adapted = adapter["adapted"]
    oh = live["overhead_with_adapter_ms"]
    what = "total - capture - infer, + in-graph adapter prefix" if adapted else "total - capture - infer"
    p99_note = " (an upper bound: the two p99s added)" if adapted else ""
    infer = seq["stages"]["infer"]["p50_ms"]
    lines = [
        f"sequential, per frame     {_pq(seq['per_frame_ms'])}   {seq['throughput_fps']:.1f} fps",
        f"  of which inference      p50 {infer:8.3f} ms",
        f"  of which tracker        {_step(seq, 'tracker_ms')}",
        f"  of which analytics      {_step(seq, 'analytics_ms')}",
        f"pipelined, saturated      {pipe['throughput_fps']:.1f} fps"
        f" = {pipe['gain_over_sequential']}x sequential; slowest stage"
        f" thread {pipe['slowest_thread_ms']:.3f} ms/frame, {pipe['efficiency']:.0%} of its bound",
        f"  end to end (queueing)   {_pq(pipe['end_to_end_ms'])}",
        f"live at {live['source_fps']:g} fps, end to end {_pq(live['end_to_end_ms'])}",
        f"  overhead around model ({what})   p50 {oh['p50']:8.3f} ms   p99 {oh['p99']:8.3f} ms{p99_note}",
    ]
    if adapted:
        measured, prefix = live["overhead_ms"], adapter["prefix_ms"]
        lines.append(
            f"    = measured p50 {measured['p50']:.3f} / p99 {measured['p99']:.3f} ms"
            f" + the prefix's p50 {prefix['p50']:.3f} / p99 {prefix['p99']:.3f} ms"
        )
    return lines


#: Other processes' load (cores) from which a phase is said to have run beside it.
BUSY_CORES = 0.25


def _host_lines(host: dict[str, Any]) -> list[str]:
    """The phases that ran beside other processes' work, which slowed their figures."""
    busy = {k: v for k, v in host["other_processes_cores"].items() if v is not None and v >= BUSY_CORES}
    if not busy:
        return []
    during = ", ".join(f"{v:.1f} during {k.replace('_', ' ')}" for k, v in busy.items())
    return [
        f"host: other processes used cores ({during}; of {host['cpus']}): the figures of those phases"
        " are slower for it"
    ]


#: Inference in a phase over inference alone by more than this share and these ms: the host changed.
DRIFT, DRIFT_MS = 1.2, 0.5


def _ms(x: float) -> str:
    """A figure in ms, to a tenth (to a µs under 1 ms)."""
    return f"{x:.1f} ms" if x >= 1 else f"{x:.3f} ms"


def _drift_lines(r: dict[str, Any]) -> list[str]:
    """A note when a phase's inference ran well over inference alone: the host ran slower
    then (its clocks, other load), so that phase's figures are not comparable as they are."""
    alone = r["pure_inference_ms"]["p50"]
    slower = {
        phase: r[phase]["stages"]["infer"]["p50_ms"]
        for phase in ("sequential", "pipelined", "live")
        if r[phase]["stages"]["infer"]["p50_ms"] > max(DRIFT * alone, alone + DRIFT_MS)
    }
    if not slower:
        return []
    during = ", ".join(f"{_ms(ms)} {phase}" for phase, ms in slower.items())
    return [
        f"note: inference took {during}, against {_ms(alone)} alone: the host ran slower then (its"
        " clocks, other load: see 'host:'); compare those figures with care, or rerun on a quiet host"
    ]


def _misses_why(live: dict[str, Any], budget: dict[str, Any]) -> str:
    """Why the live phase missed frames, when the figures say: the model does not fit the
    budget, or its inference outlasts the camera's frame interval (frames wait for it)."""
    infer_ms = budget["inference_p50_ms"]
    if not budget["fits"]:
        return (
            f"inference ({_ms(infer_ms)}) does not fit the {budget['budget_ms']:g} ms budget (see 'budget:')"
        )
    c, interval_ms = live["counts"], 1000.0 / live["source_fps"]
    missed = c["late"] + c["dropped_by_reason"].get("stale", 0)
    if missed and infer_ms > interval_ms:
        return (
            f"inference ({_ms(infer_ms)}) outlasts the camera's frame interval ({_ms(interval_ms)} at"
            f" {live['source_fps']:g} fps): frames wait for it (a lower rate, or a ladder frame_stride)"
        )
    return ""


def _live_detail_lines(live: dict[str, Any], budget: dict[str, Any]) -> list[str]:
    """The live phase in detail: detections, counts (pointing to the budget verdict when
    the model does not fit), the ladder, each stage and each profile."""
    c = live["counts"]
    lines = [
        f"  detections per published frame: {_det(live['detections_per_frame'])}",
        f"  p99 / (pre + infer + post p50) = {live['p99_over_pre_infer_post_p50']}",
        f"  frames: {c}",
    ]
    why = _misses_why(live, budget)
    if why:
        stale = c["dropped_by_reason"].get("stale", 0)
        lines.append(f"    {c['on_time']} on time, {c['late']} late, {stale} stale: {why}")
    lines += [
        f"  ladder: final step {live['ladder']['final_step']!r}, {live['ladder']['changes']} change(s)",
        "",
        f"{'stage (live)':<14}{'p50 ms':>9}{'p99 ms':>9}{'share':>8}",
    ]
    for name, st in live["stages"].items():
        lines.append(f"{name:<14}{st['p50_ms']:9.3f}{st['p99_ms']:9.3f}{st['share']:8.1%}")
    for key, name in (("tracker_ms", "tracker"), ("analytics_ms", "analytics")):
        step = live[key]
        if step is not None:
            lines.append(f"{'  ' + name:<14}{step['p50']:9.3f}{step['p99']:9.3f}  (in postprocess)")
    for name, h in live["end_to_end_ms_by_profile"].items():
        if len(live["end_to_end_ms_by_profile"]) > 1:
            lines.append(f"published by {name:<12} {h['count']:5d} frames, end to end {_pq(h)}")
    for change in live["ladder"]["history"]:
        lines.append(f"ladder: {change['from']} -> {change['to']} ({change['reason']})")
    return lines


def _bare_lines(bare: dict[str, Any], seq: dict[str, Any], live: dict[str, Any], adapted: bool) -> list[str]:
    """The plain ONNX Runtime loop, and the agent's figures against it."""
    match = bare["detections_match_sequential"]
    less = " less the in-graph prefix" if adapted else ""
    lines = [
        "",
        f"bare ONNX Runtime loop, one thread, {bare['frames']} frames ({bare['preprocessing']}):"
        f" {bare['throughput_fps']:.1f} fps",
    ]
    for name in ("pre", "infer", "post", "pre_post", "total"):
        label = {"pre_post": "pre + post"}.get(name, name)
        lines.append(f"  {label:<12}{_pq(bare[f'{name}_ms'])}")
    lines += [
        f"  detections per frame: bare {_det(bare['detections_per_frame'])}",
        f"                        sequential (the same frames) {_det(seq['detections_per_frame'])};"
        f" the same count on {match['same_count']} of {match['frames']} frames",
        f"  agent (sequential) overhead p50 / bare (pre + post) p50 ="
        f" {bare['agent_overhead_p50_ms']:.3f} / {bare['pre_post_ms']['p50']:.3f}"
        f" = {bare['overhead_over_bare_pre_post_p50']}",
        f"  agent (sequential) infer p50{less} / bare infer p50 = {bare['agent_infer_p50_ms']:.3f} /"
        f" {bare['infer_ms']['p50']:.3f} = {bare['infer_over_bare_infer_p50']}",
        f"  for information, live at {live['source_fps']:g} fps: overhead p50"
        f" {bare['live_overhead_p50_ms']:.3f} ms, infer p50{less} {bare['live_infer_p50_ms']:.3f} ms",
    ]
    return lines


def format_multi_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``run_multi_bench`` result."""
    sat, live = r["saturated"], r["live"]
    h, w = r["model_input_hw"]
    n = r["sources"]
    lines = [
        f"model {r['model']} ({w}x{h}), {r['backend'].get('backend')}, {n} sources",
        "inference alone, ms per frame by batch size: "
        + ", ".join(f"{b}: {ms:.2f}" for b, ms in r["inference_per_frame_ms"].items()),
        f"saturated: 1 source {sat['single_source_fps']:.1f} fps; {n} sources unbatched"
        f" {sat['unbatched_fps']:.1f} fps, batched {sat['batched_fps']:.1f} fps"
        f" ({sat['gain_from_batching']}x from batching, {sat['gain_over_single_source']}x one source)",
        f"  batches: mean {sat['batches']['mean_size']} frames, by size {sat['batches']['sizes']}",
        f"live: {n} sources at {live['source_fps'] or 'their own'} fps for {live['seconds']:.1f} s,"
        f" {live['throughput_fps']:.1f} fps published; batches: mean {live['batches']['mean_size']},"
        f" by size {live['batches']['sizes']}",
    ]
    for name, src in live["per_source"].items():
        c = src["counts"]
        lines.append(
            f"  {name:<10} {src['source_fps']:g} fps prio {src['priority']:>3} budget {src['budget_ms']:g} ms"
            f"  {_pq(src['end_to_end_ms'])}  on time {c['on_time']} late {c['late']} dropped {c['dropped']}"
        )
        if src["budget_advice"]:
            lines.append(f"    budget: {src['budget_advice']}")
    return "\n".join(lines)


def format_capacity_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``capacity.run_capacity`` result."""
    e, f = r["emulated"], r["frames"]
    lines = [
        f"EMULATED ACCELERATOR (measurement only): {e['recording']}, {e['device_ms']:g} ms an inference",
        f"model: {e['model']}; frames: {f['count']} of {f['hw'][1]}x{f['hw'][0]}"
        f" from {f['path']}, played from memory",
        f"kernels: {_kernels(r['kernels'])}",
        f"GIL probe, idle: {r['gil_probe_idle'].get('held_share', 0):.1%} of wake-ups waited",
    ]
    if "trial" in r:
        lines += _trial_lines(r["trial"], r["fps"], r["on_time_goal"])
        return "\n".join(lines)
    s = r["search"]
    lines.append(f"capacity search at {r['fps']:g} fps, goal {r['on_time_goal']:.0%} of frames on time:")
    for t in s["trials"]:
        cpu = t["host_cpu_us_per_frame"].get("total", 0.0)
        lines.append(
            f"  {t['sources']:4d} cameras: {t['on_time_share']:.2%} on time, {t['throughput_fps']:7.1f} fps,"
            f" {cpu:7.1f} us CPU a frame, {t['cores_used']:.2f} cores, GIL probe"
            f" {t['gil'].get('held_share', 0):.1%}  {'pass' if t['passed'] else 'FAIL'}"
        )
    lines.append(f"capacity: {s['cameras']} cameras ({s['stopped']})")
    if s["at_capacity"]:
        lines += _trial_lines(s["at_capacity"], r["fps"], r["on_time_goal"])
    return "\n".join(lines)


def _kernels(k: dict[str, Any]) -> str:
    parts = ", ".join(f"{n} {how}" for n, how in k.get("parts", {}).items()) or "none loaded"
    why = k.get("why") or ""
    return f"{parts}" + (f" ({why})" if why else "")


def _trial_lines(t: dict[str, Any], fps: float, goal: float) -> list[str]:
    cpu = t["host_cpu_us_per_frame"]
    e2e = [s["end_to_end_ms"] for s in t["per_source"].values()]
    worst = max(e2e, key=lambda h: h["p99"]) if e2e else None
    lines = [
        f"{t['sources']} cameras at {fps:g} fps for {t['seconds']:g} s: {t['on_time_share']:.2%} of"
        f" {t['captured']} frames on time ({'pass' if t['passed'] else 'FAIL'}, goal {goal:.0%}),"
        f" {t['late']} late, {t['dropped']} dropped; {t['throughput_fps']:.1f} fps published",
        "host CPU per published frame (us): "
        + ", ".join(f"{k} {v:g}" for k, v in cpu.items())
        + f"; {t['cores_used']:.2f} cores",
        f"GIL probe: {t['gil'].get('held_share', 0):.1%} of wake-ups waited"
        f" (p50 {t['gil'].get('wait_p50_ms', 0):g} ms)",
        "stages p50 (ms): " + ", ".join(f"{k} {v:g}" for k, v in t["stages_p50_ms"].items()),
    ]
    if t["steps_ms"]:
        lines.append("steps p50 (ms): " + ", ".join(f"{k} {v['p50']:g}" for k, v in t["steps_ms"].items()))
    b = t["batches"]
    lines.append(f"batches: {b.get('batches', 0)}, mean size {b.get('mean_size', 0)}")
    if worst:
        lines.append(f"end to end, the worst camera: p50 {worst['p50']:g} ms, p99 {worst['p99']:g} ms")
    lines.append("per camera: name fps on_time late dropped e2e_p50 e2e_p99")
    for name, s in t["per_source"].items():
        h = s["end_to_end_ms"]
        lines.append(
            f"  {name:8s} {s['fps']:6.2f} {s['on_time']:6d} {s['late']:5d} {s['dropped']:5d}"
            f" {h['p50']:8.3f} {h['p99']:8.3f}"
        )
    return lines
