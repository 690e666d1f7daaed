"""The capture stage: one thread per source that takes the source's next frame into a frame
slot, preprocesses it there, and hands it to the batch scheduler.

Capture and preprocessing share a thread: each is sub-millisecond, and a thread hand-off
costs tens of microseconds, so splitting them would add latency without adding
throughput. OpenCV releases the GIL, so this overlaps the inference of the previous frame.
"""

from __future__ import annotations

import logging
import time

from edge_agent.core.stages import PRE_END, PRE_START
from edge_agent.pipelines.handoff import FrameSlot
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.scheduler import BatchScheduler
from edge_agent.pipelines.source_base import EndOfStream, Pacer, SourceError
from edge_agent.pipelines.stage_control import POLL_S, StageControl

log = logging.getLogger(__name__)


class CaptureStage:
    """One source's capture thread: its ``lane`` (the source, its ladder and slots) and the
    ``scheduler`` it hands frames to."""

    def __init__(self, lane: Lane, scheduler: BatchScheduler, control: StageControl) -> None:
        self.lane = lane
        self.scheduler = scheduler
        self.control = control
        self.name = f"capture-{lane.name}"  # its thread's

    def run(self) -> None:
        """The thread: until the stop, the source's end or its failure; then the source's
        cell in the scheduler is closed (its waiting frame still runs)."""
        lane, scheduler, control = self.lane, self.scheduler, self.control
        # A file source is read only once the previous frame has been taken by the
        # scheduler: reading ahead would not raise throughput (one frame already waits)
        # but would age every frame by a whole inference time.
        read_ahead = not lane.every_frame
        # The frame-rate cap: at most one read per period, the source's frames in between
        # skipped by the source (a camera's, counted as source_gap); a stop cuts a wait short.
        cap = Pacer(lane.max_fps, control.stop.wait)
        try:
            while not control.stop.is_set():
                control.beat(self.name)
                if lane.done():
                    break
                if not read_ahead and not scheduler.wait_room(lane.index, POLL_S):
                    continue
                if cap.period_ns and cap.tick(POLL_S) is None:
                    continue
                try:
                    slot = lane.take(POLL_S, control.stop)
                except EndOfStream:
                    break
                except SourceError as e:
                    lane.error = f"source {lane.name}: {e}"
                    control.source_failed(lane.error)
                    break
                except Exception as e:  # a bug or a driver error: fail loudly, not silently
                    control.fatal(f"capture ({lane.name})", e)
                    break
                if slot is None:
                    continue
                scheduler.expect()  # the inference thread wakes while we preprocess
                if self.prepare(slot) and not scheduler.put(lane.index, slot, control.abort):
                    lane.drop(slot, "shutdown")
        finally:
            scheduler.close(lane.index)

    def prepare(self, slot: FrameSlot) -> bool:
        """Preprocess the slot's frame into its input (``Profile.preprocess``); False, and
        the frame accounted as dropped (``error``), when that failed."""
        lane = self.lane
        slot.stamps[PRE_START] = time.monotonic_ns()
        try:
            slot.profile.preprocess(slot)
        except Exception:
            log.exception("pipeline: preprocessing failed for frame %d of %s", slot.frame_id, lane.name)
            lane.drop(slot, "error")
            return False
        slot.stamps[PRE_END] = time.monotonic_ns()
        tap = lane.view_tap
        # Someone watches: this frame's pixels, if one is due (the source's image stays
        # valid until its next read).
        if tap is not None and tap.active:
            tap.offer_pixels(slot.frame)
        return True
