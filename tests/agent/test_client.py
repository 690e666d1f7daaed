"""The stream's readers (the client, `listen`, `health`) on a publisher that is not the
agent: anyone on the host may bind the endpoint while the agent is down (CURVE off). One bad
message is skipped with its reason, never the end of the reader."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import msgpack
import pytest
import zmq
from conftest import agent_command, free_endpoint, spawn

from edge_agent.client import Subscriber, parse, subscribe
from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stream_frames import MessageError, decode

GOOD = {"source": "cam0", "seq": 7, "frame_id": 7, "latency_ms": {"total": 4.0}, "detections": []}
TRACKED = {"label": "a", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1], "track_id": 2, "track_age": 5}

#: What a hostile publisher sends: each is refused by the decoder or the parser.
BAD = [
    b"det.cam0 {" + b"[" * 5000,  # deeper than the JSON bound (json.loads would recurse)
    b"det.cam0 " + msgpack.packb({"source": b"bytes"}),  # msgpack bin: not a JSON value
    b"det.cam0 " + msgpack.packb(msgpack.ExtType(1, b"x")),
    b'det.cam0 {"source": "cam0", "seq": NaN}',
    b'det.cam0 {"source": "cam0", "seq": "seven", "frame_id": 1}',
    b'det.cam0 {"seq": 1}',  # no source
    b'det.cam0 {"source": "cam0", "seq": 1, "frame_id": 1, "detections": [{"label": 5}]}',
    b"det.cam0 " + json.dumps([1, 2]).encode(),  # not an object
    b"\xff\xfe " + json.dumps(GOOD).encode(),  # a topic that is not UTF-8
    b"det.cam0 " + b"x" * ((1 << 20) + 1),  # over the frame bound
    b"det.cam0 " + json.dumps(GOOD | {"schema": SCHEMA_VERSION + 1}).encode(),  # a later version
    b"det.cam0 " + json.dumps(GOOD | {"schema": "2"}).encode(),
    b"det.cam0 " + json.dumps(GOOD | {"tracking": [1]}).encode(),  # journeys: not an object
    b"det.cam0 " + json.dumps(GOOD | {"tracking": {"journeys": [[3, 1]]}}).encode(),
    b"det.cam0 "
    + json.dumps(
        GOOD | {"tracking": {"journeys": {"3": "one"}}, "detections": [TRACKED | {"track_id": 3}]}
    ).encode(),
]


@pytest.mark.parametrize("frame", BAD, ids=range(len(BAD)))
def test_each_bad_frame_is_a_message_error(frame):
    with pytest.raises(MessageError):
        topic, body = decode(frame)
        parse(topic, body)


def test_a_good_frame_parses():
    topic, body = decode(b"det.cam0 " + json.dumps(GOOD).encode())
    assert parse(topic, body).seq == 7


def test_a_detection_reads_its_journey_from_the_result_and_an_event_names_its_own():
    """Track 3 continues journey 1 (the result's tracking.journeys); track 2 is a journey
    of its own; an untracked detection has none. An event without journey_id (an agent
    before journeys) is its track's journey."""
    dets = [TRACKED, TRACKED | {"track_id": 3}, TRACKED | {"track_id": None}]
    result = parse("det.cam0", GOOD | {"detections": dets, "tracking": {"journeys": {"3": 1}}})
    assert [d.journey_id for d in result.detections] == [2, 1, None]
    event = {
        "type": "event", "source": "cam0", "seq": 0, "run_id": "r", "kind": "cross", "line": "door",
        "direction": "in", "track_id": 3, "label": "a", "frame_id": 9, "at_unix_s": 1.0,
    }  # fmt: skip
    assert parse("event.cam0", event | {"journey_id": 1}).journey_id == 1
    assert parse("event.cam0", event).journey_id == 3


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_a_message_of_this_or_an_earlier_schema_version_parses(version):
    topic, body = decode(b"det.cam0 " + json.dumps(GOOD | {"schema": version}).encode())
    assert parse(topic, body).seq == 7, f"schema {version} of {SCHEMA_VERSION}"


def test_a_later_schema_version_is_named_in_the_refusal():
    with pytest.raises(MessageError, match=f"schema {SCHEMA_VERSION + 1}, not 1 to {SCHEMA_VERSION}"):
        parse("det.cam0", GOOD | {"schema": SCHEMA_VERSION + 1})


def _feeding(pub: zmq.Socket, frames: list[bytes]):
    """A thread that sends ``frames`` over and over until stopped: a SUB that joins late
    misses what was sent before, so the test publishes until the reader has what it needs."""
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            for f in frames:
                pub.send(f)
            stop.wait(0.05)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return stop, thread


def test_subscribe_skips_bad_messages_and_yields_the_good_ones():
    endpoint = free_endpoint()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.linger = 0
    pub.bind(endpoint)
    got = []
    stop, feeder = _feeding(pub, [*BAD, b"det.cam0 " + json.dumps(GOOD).encode()])
    try:
        stream = subscribe(endpoint, topics=("det",), timeout_s=30)
        for msg in stream:
            got.append(msg)
            if len(got) == 3:
                break
        stream.close()
    finally:
        stop.set()
        feeder.join()
        pub.close()
    assert [(m.source, m.seq) for m in got] == [("cam0", 7)] * 3


def _decodes(frame: bytes) -> bool:
    try:
        decode(frame)
    except MessageError:
        return False
    return True


def test_the_subscriber_refuses_each_bad_frame_and_reads_on():
    """The subscriber's recv raises MessageError for a bad frame and is then still usable;
    recv_frame hands the frame over as it came; a receive that times out returns None."""
    endpoint = free_endpoint()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.linger = 0
    pub.bind(endpoint)
    good = b"det.cam0 " + json.dumps(GOOD).encode()
    undecodable = [f for f in BAD if f.startswith(b"det.") and not _decodes(f)]  # the rest parse() refuses
    refused, decoded, raw = 0, [], []
    stop, feeder = _feeding(pub, [*undecodable, good, b"other.cam0 " + json.dumps(GOOD).encode()])
    try:
        with Subscriber(endpoint, ("det",), timeout_s=30) as sub:
            while len(decoded) < 3:
                try:
                    got = sub.recv()
                except MessageError:
                    refused += 1
                    continue
                assert got is not None, "nothing within 30 s"
                decoded.append(got)
            while good not in raw and len(raw) < 10 * len(undecodable):
                frame = sub.recv_frame()
                assert frame is not None, "nothing within 30 s"
                raw.append(frame)
    finally:
        stop.set()
        feeder.join()
        pub.close()
    assert decoded == [("det.cam0", GOOD)] * 3, "only the subscribed topic, decoded"
    assert refused >= len(undecodable), f"{refused} frames refused, fewer than a round of the bad ones"
    assert good in raw and all(f.startswith(b"det.cam0 ") for f in raw), "frames as they came"
    with Subscriber(endpoint, ("det",), timeout_s=0.05) as quiet:
        assert quiet.recv() is None and quiet.recv_frame() is None, "a timeout is None"


def test_listen_tells_and_skips_bad_messages_and_prints_the_good_ones():
    endpoint = free_endpoint()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.linger = 0
    pub.bind(endpoint)
    stop, feeder = _feeding(pub, [*BAD, b"det.cam0 " + json.dumps(GOOD).encode()])
    try:
        command = agent_command("listen", endpoint, "--count", "2", "--timeout", "30")
        with spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            out, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        feeder.join()
        pub.close()
    assert proc.returncode == 0, err
    assert out.count("cam0 seq=7") == 2, out
    assert "a message skipped" in err and "Traceback" not in err, err


def test_a_frame_of_unterminated_strings_is_refused_in_linear_time():
    """Many quotes and no closing one: the depth check's string scan was quadratic (64 kB took
    17 s, the 1 MiB a frame may be would take over an hour, stalling the uplink's reader).
    The bound is on a hang, not on speed: linear takes about 0.1 s."""
    frame = b"det.cam0 {" + b'"\\' * ((1 << 19) - 16)
    started = time.monotonic()
    with pytest.raises(MessageError, match="not JSON"):
        decode(frame)
    assert time.monotonic() - started < 20
