"""Power manager (clock locking, save/restore, telemetry): not built yet, see issue 5."""
