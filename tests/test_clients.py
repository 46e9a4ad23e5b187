"""The clients as subprocesses against a real server on an ephemeral port."""

import argparse
import importlib.util
import itertools
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile
import srt
import webvtt

import captions
from benchmarks.conversations import conversation, synthetic_voices
from benchmarks.text import word_error_rate
from clients import mic, soak, soak_figures
from realtime.config import ServerConfig
from tests.conftest import ROOT, SAMPLES
from tests.server_harness import ServerThread, unmeasured, wait_until
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.runner import WhisperRunner

WELCOME = str(SAMPLES / "welcome.wav")


def voxrt(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "realtime.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def server(whisper_model):
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), unmeasured(max_session_seconds=30))
    yield harness
    harness.stop()


@pytest.mark.slow
def test_stream_prints_the_transcript_and_json_events(server, welcome):
    _, text = welcome
    result = voxrt("stream", WELCOME, "--url", server.url, "--speed", "4")
    assert result.returncode == 0, result.stderr
    assert word_error_rate(text, result.stdout.strip().splitlines()[-1]) <= 0.1, result.stdout
    result = voxrt("stream", WELCOME, "--url", server.url, "--speed", "0", "--json")
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0 and events[-1]["type"] == "transcription.done"
    assert {e["type"] for e in events} <= {"transcription.delta", "transcription.done"}
    result = voxrt("stream", WELCOME, "--url", server.url, "--speed", "4", "--json", "--interim")
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0 and {e["type"] for e in events} == {
        "transcription.delta",
        "transcription.interim",
        "transcription.done",
    }


@pytest.mark.slow
def test_stream_on_deepgrams_wire_prints_the_transcript_events_and_captions(server, welcome, tmp_path):
    _, text = welcome
    result = voxrt("stream", WELCOME, "--url", server.url, "--wire", "deepgram", "--speed", "4")
    assert result.returncode == 0, result.stderr
    assert word_error_rate(text, result.stdout.strip().splitlines()[-1]) <= 0.1, result.stdout
    result = voxrt("stream", WELCOME, "--url", server.url, "--wire", "deepgram", "--speed", "0", "--json")
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0 and messages[-1]["type"] == "Metadata"
    assert {m["type"] for m in messages} == {"Results", "Metadata"}
    out = tmp_path / "welcome.srt"
    args = ("--wire", "deepgram", "--speed", "0", "--format", "srt", "-o", str(out))
    result = voxrt("stream", WELCOME, "--url", server.url, *args)
    assert result.returncode == 0, result.stderr
    cues = [c.content for c in srt.parse(out.read_text())]
    assert cues and word_error_rate(text, " ".join(cues).replace("\n", " ")) <= 0.1


def test_stream_writes_captions_the_format_libraries_read_back(server, tmp_path):
    result = voxrt("stream", WELCOME, "--url", server.url, "--speed", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    transcript = json.loads(result.stdout)
    words = transcript["words"]
    assert " ".join(w["word"] for w in words) == transcript["text"]
    cues = captions.cues(words)
    assert " ".join(line for cue in cues for line in cue.lines) == transcript["text"]
    said = iter(words)
    for cue in cues:  # each cue spans its own words, at most two lines of about 42 characters
        own = [next(said) for _ in " ".join(cue.lines).split()]
        assert (cue.start, cue.end) == (own[0]["start"], own[-1]["end"])
        assert len(cue.lines) <= 2 and all(len(line) <= 42 for line in cue.lines)
    assert all(a.end <= b.start for a, b in itertools.pairwise(cues)) and len(cues) >= 2

    for fmt in ("srt", "vtt"):
        out = tmp_path / f"welcome.{fmt}"
        result = voxrt(
            "stream", WELCOME, "--url", server.url, "--speed", "0", "--format", fmt, "-o", str(out)
        )
        assert result.returncode == 0, result.stderr
        if fmt == "srt":
            parsed = [
                (c.start.total_seconds(), c.end.total_seconds(), c.content)
                for c in srt.parse(out.read_text())
            ]
        else:
            parsed = [(c.start_in_seconds, c.end_in_seconds, c.text) for c in webvtt.read(str(out))]
        assert parsed and all(start <= end for start, end, _ in parsed)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(parsed))
        assert word_error_rate(transcript["text"], " ".join(text for _, _, text in parsed)) <= 0.1
        assert result.stdout.strip().splitlines()[-1] in " ".join(
            text.replace("\n", " ") for *_, text in parsed
        )


def test_stream_with_speakers_names_each_speaker_on_cues_turns_and_words(server, tmp_path):
    talk = conversation("clients", synthetic_voices(tmp_path), 2, 4, seed=2)
    wav = tmp_path / "talk.wav"
    soundfile.write(wav, talk.audio, SAMPLE_RATE)
    written = {}
    for fmt in ("json", "srt", "vtt", "text"):
        out = tmp_path / f"talk.{fmt}"
        result = voxrt(
            "stream",
            str(wav),
            "--url",
            server.url,
            "--speed",
            "0",
            "--speakers",
            "--format",
            fmt,
            "-o",
            str(out),
        )
        assert result.returncode == 0, result.stderr
        written[fmt] = out
    # Each run labels on its own: how fast it was read decides when its words were labelled.
    words = json.loads(written["json"].read_text())["words"]
    runs = [speaker for speaker, _ in itertools.groupby(w["speaker"] for w in words)]
    assert set(runs) == {"S1", "S2"} and len(runs) >= 3, runs
    voices = [c.voice for c in webvtt.read(str(written["vtt"]))]
    assert set(voices) == {"S1", "S2"}, voices
    named = [c.content.split(": ", 1)[0] for c in srt.parse(written["srt"].read_text())]
    assert set(named) == {"S1", "S2"}, named
    turns = [line.split(": ", 1)[0] for line in written["text"].read_text().splitlines()]
    assert set(turns) == {"S1", "S2"} and all(a != b for a, b in itertools.pairwise(turns)), turns


def test_stream_exit_codes(server, tmp_path):
    bad = tmp_path / "not-audio.wav"
    bad.write_text("this is not audio")
    unreadable = voxrt("stream", str(bad), "--url", server.url)
    assert unreadable.returncode == 2 and "cannot read" in unreadable.stderr
    assert len(unreadable.stderr.strip().splitlines()) == 1
    not_numbers = tmp_path / "not-numbers.wav"
    soundfile.write(not_numbers, np.r_[np.zeros(16000, np.float32), np.nan], 16000, subtype="FLOAT")
    nan = voxrt("stream", str(not_numbers), "--url", server.url)
    assert nan.returncode == 2 and "no number (NaN, infinity) 1.00 s in" in nan.stderr, nan.stderr
    missing = voxrt("stream", str(tmp_path / "missing.wav"), "--url", server.url)
    assert missing.returncode == 2
    refused = voxrt("stream", WELCOME, "--url", "ws://127.0.0.1:9/v1/realtime")
    assert refused.returncode == 3 and "cannot connect" in refused.stderr
    usage = voxrt("stream", WELCOME, "--chunk-ms", "0")
    assert usage.returncode == 2


@pytest.mark.slow
def test_stream_exits_1_on_a_server_error(server, tmp_path):
    import numpy as np
    import soundfile

    long_file = tmp_path / "long.wav"
    soundfile.write(long_file, np.zeros(16000 * 32, np.float32), 16000)  # past the 30 s limit
    result = voxrt("stream", str(long_file), "--url", server.url, "--speed", "0")
    assert result.returncode == 1 and "session_too_long" in result.stderr


@pytest.mark.slow
def test_mic_with_input_file_stops_cleanly_on_sigint(server, welcome, tmp_path):
    _, text = welcome
    captions = tmp_path / "mic.vtt"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "realtime.cli", "mic", "--input-file", WELCOME, "--url", server.url),
            *("--save", str(captions)),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Ctrl-C once the client is streaming: its first delta has reached the server's counters.
    before = server.metrics().get("voxrt_deltas_total", 0)
    deadline = time.monotonic() + 60
    while server.metrics().get("voxrt_deltas_total", 0) <= before and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    final = out.strip().splitlines()[-1]
    # Cut short by Ctrl-C: what it heard is the start of the text, word for word.
    heard_of = " ".join(text.split()[: len(final.split())])
    assert "morning" in final.lower() and word_error_rate(heard_of, final) <= 0.2, out
    assert "Traceback" not in err
    # --save: the same words as captions, timed, that webvtt reads back.
    cues = webvtt.read(str(captions))
    assert " ".join(c.text.replace("\n", " ") for c in cues) == final
    assert all(a.end_in_seconds <= b.start_in_seconds for a, b in itertools.pairwise(cues))


def test_mic_and_soak_say_why_an_input_they_cannot_read_or_open_ends_them(server, tmp_path):
    """A file that is no recording, and a device that cannot open (a machine without a
    microphone): each ends the client with exit 2 and the reason, never a wait for audio."""
    bad = tmp_path / "not-audio.wav"
    bad.write_text("this is not audio")
    for client in (["mic", "--input-file", str(bad)], ["soak", "--audio", str(bad)]):
        unreadable = voxrt(*client, "--url", server.url)
        assert unreadable.returncode == 2 and f"cannot read {bad}" in unreadable.stderr, client
    no_device = voxrt("mic", "--device", "999", "--url", server.url)
    assert no_device.returncode == 2 and "the audio input failed" in no_device.stderr, no_device.stderr


def test_mic_without_portaudio_gives_a_hint(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_portaudio(name, *args, **kwargs):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_portaudio)
    parser = argparse.ArgumentParser()
    mic.add_arguments(parser)
    assert mic.run(parser.parse_args(["--list-devices"])) == 2
    assert "libportaudio2" in capsys.readouterr().err


def test_soak_without_matplotlib_refuses_a_plot_before_it_runs(server, monkeypatch, capsys):
    """An hour's soak ended in a plot it could not draw: it is said before the run, exit 2."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    args = parser.parse_args(["--url", server.url, "--duration", "1h", "--plot", "out.png"])
    assert soak.run(args) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["vllm", "openai"])
def test_soak_passes_on_a_healthy_server(server, tmp_path, wire):
    report, plot = tmp_path / "report.json", tmp_path / "soak.png"
    result = voxrt(
        "soak",
        "--url",
        server.url,
        "--wire",
        wire,
        "--sessions",
        "2",
        "--duration",
        "8s",
        "--speed",
        "3",
        "--churn",
        "--sample-seconds",
        "2",
        # The latency bound is an operator's, for a machine they know; this one may be shared.
        "--max-p95-latency",
        "60",
        "--report",
        str(report),
        "--plot",
        str(plot),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    assert data["utterances"] >= 3 and data["errors"] == {} and data["encoder_cache_rows_after"] == 0
    assert data["latency_s"]["p95"] is not None and data["rss_mb"]["end"] > 0
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_soak_catches_a_leaking_server(whisper_model, tmp_path):
    leaky = ServerThread(WhisperRunner(whisper_model), ServerConfig())
    scheduler = leaky.engine.scheduler
    # The leak under test: a finished utterance's encoder-cache references are never dropped.
    scheduler.finish_request = lambda request_id: scheduler.requests.pop(request_id, None)
    try:
        result = voxrt(
            "soak",
            "--url",
            leaky.url,
            "--sessions",
            "2",
            "--duration",
            "8s",
            "--speed",
            "3",
            "--churn",
            "--sample-seconds",
            "2",
        )
    finally:
        leaky.stop()
    assert result.returncode == 1
    assert "encoder-cache rows still referenced" in result.stderr


def soak_report(rss_mb: list[float], **changes) -> dict:
    """What `soak` reports for a clean run whose server RSS was sampled every 10 s."""
    samples = [{"t": 10.0 * i, "rss_mb": rss} for i, rss in enumerate(rss_mb)]
    report = {
        "errors": {},
        "latency_s": {"p95": 0.5},
        "worst_window": {"seconds": 30.0, "p95_s": 0.8, "ended_at_s": 40.0},
        "sheds": 0,
        "server_sheds": 0,
        "encoder_cache_rows_after": 0,
        "kv_slots_after": 0,
        "utterances": 10,
        "rss_growth_after_warmup_mb": soak_figures.rss_growth_mb(samples, warmup_until=20.0),
    }
    slope, error = soak_figures.rss_slope_mb_per_hour(samples, warmup_until=20.0)
    slope_report = {"rss_slope_mb_per_hour": slope, "rss_slope_stderr_mb_per_hour": error}
    return report | slope_report | changes


SOAK_BOUNDS = argparse.Namespace(max_p95_latency=3.0, max_rss_growth=200.0, max_rss_slope=100.0)


def test_soak_fails_a_server_whose_memory_grows_and_passes_one_that_holds_flat():
    args = SOAK_BOUNDS
    # Loading grows RSS during warm-up; that is not a leak.
    flat = soak_report([300, 700, 760, 762, 761, 763, 760, 762])
    assert soak.verdict(flat, args) == []
    leaking = soak_report([300, 700, 760, 820, 880, 940, 1000, 1060])
    failures = soak.verdict(leaking, args)
    assert "RSS grew 300 MB after warm-up > 200.0 MB" in failures[0], failures
    # Windows allocated, then the heap trimmed: a saw-tooth whose last tooth is no leak.
    sawtooth = soak_report([300, 700, 650, 870, 640, 880, 660, 860, 650, 870])
    assert soak.verdict(sawtooth, args) == []


def test_a_ten_minute_soak_fails_a_leak_of_a_gigabyte_an_hour():
    """Ten minutes of a 1 GB/h leak grow the server 130 MB after warm-up: under the total's
    bound, over the rate's."""
    rng = np.random.default_rng(0)
    rss = [700 + 1000 * 10 * i / 3600 + rng.normal(0, 20) for i in range(60)]
    failures = soak.verdict(soak_report(rss), SOAK_BOUNDS)
    assert len(failures) == 1 and failures[0].startswith("RSS grows ") and "MB/h after warm-up" in failures[0]
    flat = [700 + rng.normal(0, 20) for _ in range(60)]
    assert soak.verdict(soak_report(flat), SOAK_BOUNDS) == []


def test_soak_fails_a_server_slower_than_the_operators_latency_bound():
    report = soak_report([300, 700, 760, 762, 761, 763, 760, 762], latency_s={"p95": 4.8})
    assert soak.verdict(report, SOAK_BOUNDS) == ["p95 delta latency 4.80 s > 3.0 s"]
    assert soak.verdict(report, argparse.Namespace(**vars(SOAK_BOUNDS) | {"max_p95_latency": 5.0})) == []


def test_soak_fails_a_stall_its_whole_run_hides_and_any_shed():
    stalled = soak_report([700] * 8, worst_window={"seconds": 30.0, "p95_s": 9.2, "ended_at_s": 250.0})
    assert soak.verdict(stalled, SOAK_BOUNDS) == [
        "a stall: p95 delta latency 9.20 s > 3.0 s over the 30 s ending 250 s into the run"
    ]
    assert soak.verdict(soak_report([700] * 8, server_sheds=4), SOAK_BOUNDS) == ["4 admitted sessions shed"]
    assert soak.verdict(soak_report([700] * 8, sheds=1), SOAK_BOUNDS) == ["1 admitted sessions shed"]


def test_the_worst_window_is_read_between_scrapes_a_window_apart():
    """Cumulative histograms scraped every 10 s: one stall of 10 s inside a long calm run."""
    scrapes, fast, slow = [], 0.0, 0.0
    for i in range(31):
        t = 10.0 * i
        if t == 160.0:
            slow += 10
        else:
            fast += 10
        buckets = {"le=0.5": fast, "le=10.0": fast + slow, "le=+Inf": fast + slow}
        scrapes.append((t, buckets))
    p95, ended_at = soak_figures.worst_window_p95(scrapes, 30.0)
    assert p95 > 3.0 and 160.0 <= ended_at <= 180.0
    assert soak_figures.histogram_quantile(scrapes[0][1], scrapes[-1][1], 0.95) < 3.0
    assert soak_figures.worst_window_p95(scrapes[:3], 30.0) is None


@pytest.mark.slow
def test_demo_serves_and_transcribes_a_file(welcome, tmp_path):
    """README's main job: `voxrt demo [FILE]` serves the default model on a free port and
    streams the file (by default the bundled sample) through it in real time."""
    import soundfile

    samples, _ = welcome
    first_sentences = tmp_path / "first.wav"
    soundfile.write(first_sentences, samples[: 4 * 16000], 16000)
    result = voxrt("demo", str(first_sentences))
    assert result.returncode == 0, result.stderr
    final = result.stdout.strip().splitlines()[-1]
    assert final.lower().startswith("final: good morning everyone. today we will"), final


@pytest.mark.slow
def test_stream_waits_for_a_busy_server_as_its_retry_after_asks(whisper_model):
    """A full server answers 503 with Retry-After; `voxrt stream` says so, waits, and gets in
    once a seat is free."""
    full = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=1)
    try:
        seated = full.connect()
        client = subprocess.Popen(
            [sys.executable, "-m", "realtime.cli", "stream", WELCOME, "--url", full.url, "--speed", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: full.metrics().get("voxrt_refusals_total{reason=server_busy}", 0) >= 1, 60)
        seated.close()
        out, err = client.communicate(timeout=120)
    finally:
        full.stop()
    assert client.returncode == 0, err
    assert "server refused (HTTP 503); retrying" in err
    assert "morning" in out.lower()
