"""Does a model's measured work fit the per-frame deadline? One verdict, worded once, for
``run`` (after warm-up), ``models check`` and ``bench``.

A frame's end-to-end time is its wait for the accelerator, its inference, and the small
rest (preprocessing, decoding, publishing). The wait depends on the source: a camera whose
frame interval is longer than the inference finds the accelerator idle; a faster camera's
newest frame waits up to one frame interval for the inference in progress (older frames
are overrun); a file's frames are all processed, each waiting for the one before. A model
whose frames cannot end within the budget this way loses nearly all of them to admission
(``stale``) or publishes them late, which reads as a broken agent unless said at start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Inference time varies between runs and hosts (clocks, other processes): 10 % on top.
INFER_SPREAD = 1.1
#: Preprocessing, decoding and publishing of a frame, besides inference (an Ultralytics
#: export at 640 with dozens of boxes takes 1-2 ms here).
REST_MS = 2.0
#: The budget suggested: what a frame needs, with this headroom, rounded up to 10 ms.
HEADROOM = 1.25
#: A camera that has not said its rate: the most common one.
DEFAULT_CAMERA_FPS = 30.0


@dataclass(frozen=True)
class BudgetFit:
    """Inference of ``infer_ms`` (measured) against a budget of ``budget_ms``, for a camera
    with a frame interval of ``period_ms``, or a source whose every frame is processed
    (``period_ms`` None: a file, or an unpaced source)."""

    infer_ms: float
    budget_ms: float
    period_ms: float | None = 1000.0 / DEFAULT_CAMERA_FPS

    @property
    def wait_ms(self) -> float:
        """The longest a frame waits for the inference before it."""
        if self.period_ms is None:
            return self.infer_ms
        return self.period_ms if self.infer_ms > self.period_ms else 0.0

    @property
    def needed_ms(self) -> float:
        """What a frame needs from capture to publish."""
        return INFER_SPREAD * self.infer_ms + self.wait_ms + REST_MS

    @property
    def fits(self) -> bool:
        return self.needed_ms <= self.budget_ms

    @property
    def suggested_budget_ms(self) -> int:
        return int(math.ceil(self.needed_ms * HEADROOM / 10) * 10)

    def advice(self, what: str, where: str = "deadline.budget_ms") -> str | None:
        """One line for a model that does not fit (None when it does): the figures, what
        will happen, and the choices. ``what`` names the model (and source); ``where`` the
        setting that holds the budget."""
        if self.fits:
            return None
        if self.period_ms is None:
            wait = f"each frame waits up to {self.wait_ms:.0f} ms for the one before (all are processed)"
        elif self.wait_ms:
            wait = (
                f"the camera's newest frame waits up to {self.wait_ms:.0f} ms (a frame interval) for the"
                " inference in progress"
            )
        else:
            wait = "the accelerator is idle when a frame comes"
        late = "published late" if self.period_ms is None else "dropped as stale (or published late)"
        flag = f", or run --budget-ms {self.suggested_budget_ms}" if where == "deadline.budget_ms" else ""
        return (
            f"{what}: inference takes {self.infer_ms:.1f} ms a frame here and {wait}: a frame needs about"
            f" {self.needed_ms:.0f} ms, over the {self.budget_ms:g} ms budget ({where}), so most frames"
            f" will be {late}. Choices: raise the budget ({where}: {self.suggested_budget_ms}{flag}); a"
            " smaller input (export at imgsz=320); a ladder step with a smaller model or a frame_stride"
            " (deadline.ladder); or deadline.admission: false to publish every frame, late"
        )
