"""What a config asks the agent to load and run: the models each source may run (its own,
or the main one and the ladder's), the largest batch each model gets, a model's settings,
and the ONNX Runtime options a backend config runs a model with."""

from __future__ import annotations

from collections import Counter
from dataclasses import MISSING, Field, fields, replace
from typing import Any

from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import (
    AutoBackendConfig,
    BackendConfig,
    EmulatedConfig,
    ModelConfig,
    OnnxRuntimeConfig,
    TensorRTConfig,
)
from edge_agent.core.source_config import SCHEDULING_FIELDS, SourceConfig


def capture_part(src: SourceConfig) -> SourceConfig:
    """A source's config without its scheduling settings: what needs a reopen to change."""
    return replace(src, **{f.name: _default(f) for f in fields(src) if f.name in SCHEDULING_FIELDS})


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def model_at(cfg: AgentConfig, path: str, manifest: str = "") -> ModelConfig:
    """The settings of the model at ``path`` (a ladder step's or a source's own, with the
    config's thresholds); the main model for an empty ``path``."""
    return replace(cfg.model, path=path, manifest=manifest) if path else cfg.model


def onnxruntime_of(backend: BackendConfig, running: str = "") -> OnnxRuntimeConfig | None:
    """The ONNX Runtime settings a backend config runs a model with: its own, or an
    ``auto`` backend's ONNX Runtime part (unless ``running``, the backend ``auto`` chose
    when the model was loaded, is another); None for TensorRT."""
    if isinstance(backend, OnnxRuntimeConfig):
        return backend
    if isinstance(backend, AutoBackendConfig) and running in ("", "onnxruntime"):
        return backend.onnxruntime
    return None


def source_models(cfg: AgentConfig) -> list[tuple[SourceConfig, tuple[str, ...]]]:
    """Per source, the models (by path; the main one is "") it may run, its own first: a
    source's own model, or the main one and the ladder's lighter ones."""
    ladder = tuple(dict.fromkeys(step.model for step in cfg.deadline.ladder if step.model))
    return [(src, (src.model,) if src.model else ("", *ladder)) for src in cfg.source_list()]


def model_batches(cfg: AgentConfig) -> dict[str, int]:
    """Per model path, the largest batch it can be given: the number of sources that may
    run it, within ``batching.max_batch`` (the main model is loaded even when no source
    runs it)."""
    users = Counter(path for _, paths in source_models(cfg) for path in paths)
    users.setdefault("", 0)
    cap = cfg.batching.max_batch
    return {k: max(1, min(n, cap) if cap else n) for k, n in users.items()}


def with_batch(backend: BackendConfig, batch: int) -> BackendConfig:
    """``backend`` with TensorRT's ``max_batch: 0`` (one per source) resolved to ``batch``."""
    if isinstance(backend, (TensorRTConfig, EmulatedConfig)) and not backend.max_batch:
        return replace(backend, max_batch=batch)
    if isinstance(backend, AutoBackendConfig) and not backend.tensorrt.max_batch:
        return replace(backend, tensorrt=replace(backend.tensorrt, max_batch=batch))
    return backend
