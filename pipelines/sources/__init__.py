"""Frame sources: the interface and its pacing (``base``), the registry that builds a
source from its config (``registry``), and one module per kind: the synthetic camera
(``synthetic``), files (``files``: a video, an image folder), live capture (``live``:
V4L2, RTSP, GStreamer) and frames played from memory (``memory``)."""
