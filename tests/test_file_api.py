"""OpenAI's file API through the openai SDK, unchanged, against a real `voxrt serve`: every
response format, streamed deltas, any container and rate, bad, oversize and overlong files, a
file that decodes to far more than its bytes, and the WebSocket wires on the same port at the
same time."""

import asyncio
import io
import itertools
import socket
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest
import soundfile
import soxr
import srt
import webvtt
from openai.types.audio import TranscriptionDiarized

from benchmarks.conversations import conversation, synthetic_voices, word_accuracy
from benchmarks.text import word_error_rate
from clients.audio import load_audio_file
from realtime.config import ServerConfig
from realtime.protocols.language_names import LANGUAGE_NAMES
from tests.conftest import SAMPLES
from tests.server_harness import (
    ResidentMemory,
    ServerProcess,
    ServerThread,
    events_until,
    hold_steps,
    metric,
    stream,
    wait_until,
)
from voxtral.runner import TimedWord
from voxtral.whisper.runner import WhisperRunner

WELCOME = SAMPLES / "welcome.wav"
MAX_UPLOAD_MB = 1


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    process = ServerProcess(
        f"--max-upload-mb={MAX_UPLOAD_MB}", log_path=tmp_path_factory.mktemp("log") / "serve.log"
    )
    yield process
    process.stop()


def sdk(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="unused", max_retries=0)


def welcome_text() -> str:
    return (SAMPLES / "welcome.txt").read_text().strip()


def transcribe(served, **options):
    return sdk(served).audio.transcriptions.create(
        file=("welcome.wav", WELCOME.read_bytes()), model="whisper-1", **options
    )


def assert_timed(spans: list, seconds: float) -> None:
    """Start before end, in order, inside the audio."""
    assert spans
    for span in spans:
        assert 0 <= span.start <= span.end <= seconds + 0.01, span
    starts = [span.start for span in spans]
    assert starts == sorted(starts)


def test_every_response_format_gives_the_same_words(served):
    seconds = len(load_audio_file(WELCOME)) / 16000
    as_json = transcribe(served)
    assert word_error_rate(welcome_text(), as_json.text) <= 0.1, as_json.text
    assert as_json.usage.type == "duration" and as_json.usage.seconds == 12
    assert transcribe(served, response_format="text") == as_json.text + "\n"

    verbose = transcribe(served, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert verbose.text == as_json.text and verbose.language == "english"
    assert abs(verbose.duration - seconds) < 0.01
    assert_timed(verbose.words, seconds)
    assert_timed(verbose.segments, seconds)
    assert " ".join(w.word for w in verbose.words) == as_json.text
    assert "".join(s.text for s in verbose.segments).strip() == as_json.text
    plain = transcribe(served, response_format="verbose_json")
    assert plain.words is None and plain.segments == verbose.segments

    cues = list(srt.parse(transcribe(served, response_format="srt")))
    assert " ".join(c.content.replace("\n", " ") for c in cues) == as_json.text
    assert [c.start.total_seconds() for c in cues] == [round(s.start, 3) for s in verbose.segments]
    vtt = webvtt.from_buffer(io.StringIO(transcribe(served, response_format="vtt")))
    assert [c.text.replace("\n", " ") for c in vtt] == [c.content.replace("\n", " ") for c in cues]


def test_streamed_deltas_add_up_to_the_done_text_with_logprobs(served):
    events = list(transcribe(served, stream=True, include=["logprobs"]))
    *deltas, done = events
    assert deltas and all(e.type == "transcript.text.delta" for e in deltas)
    assert done.type == "transcript.text.done"
    assert " ".join(e.delta for e in deltas) == done.text
    assert word_error_rate(welcome_text(), done.text) <= 0.1
    assert [p.token for p in done.logprobs] == [p.token for e in deltas for p in e.logprobs]
    assert all(p.logprob <= 0 and p.bytes for p in done.logprobs)


def test_the_async_client_unchanged(served):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="unused")
        file = ("welcome.wav", WELCOME.read_bytes())
        whole, events = await asyncio.gather(
            client.audio.transcriptions.create(file=file, model="whisper-1"),
            client.audio.transcriptions.create(file=file, model="whisper-1", stream=True),
        )
        return whole, [event async for event in events]

    whole, events = asyncio.run(run())
    assert events[-1].type == "transcript.text.done" and events[-1].text == whole.text


def flac(samples: np.ndarray, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="FLAC")
    return out.getvalue()


def test_the_model_list_names_the_served_model_and_what_it_names_is_transcribed(served):
    """vLLM's clients ask a server which model it runs, `client.models.list().data[0].id`."""
    client = sdk(served)
    listed = client.models.list().data
    assert listed[0].id == "whisper-tiny.en" and {m.id for m in listed} == {"whisper-tiny.en", "whisper"}
    assert all(m.object == "model" and m.owned_by == "voxrt" and m.created > 0 for m in listed)
    assert client.models.retrieve("whisper").id == "whisper"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o-transcribe")
    assert missing.value.code == "model_not_found"
    text = client.audio.transcriptions.create(file=("w.wav", WELCOME.read_bytes()), model=listed[0].id).text
    assert word_error_rate(welcome_text(), text) <= 0.1
    # What this server does not serve is said as OpenAI's errors are, with what it does serve.
    with pytest.raises(openai.NotFoundError) as elsewhere:
        client.chat.completions.create(model=listed[0].id, messages=[{"role": "user", "content": "hi"}])
    assert elsewhere.value.code == "not_found" and "/v1/audio/transcriptions" in elsewhere.value.message


def test_a_flac_at_44100_hz_in_stereo_reads_as_the_wav(served):
    samples = load_audio_file(WELCOME)
    stereo = soxr.resample(samples, 16000, 44100)
    stereo = np.stack([stereo, stereo * 0.5], axis=1)
    file = ("welcome.flac", flac(stereo, 44100))
    got = sdk(served).audio.transcriptions.create(file=file, model="whisper-1")
    assert word_error_rate(welcome_text(), got.text) <= 0.1, got.text


def float_wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, 16000, format="WAV", subtype="FLOAT")
    return out.getvalue()


def test_a_float_file_past_full_scale_is_heard_as_its_samples_clipped(served):
    """The wires carry 16-bit samples, which end at full scale; a float file's samples may not.
    Far past it, a spectrum's powers overflow and the text would be nothing: the file is heard
    as the same file clipped at full scale (infinitely clipped speech still carries words)."""
    loud = load_audio_file(WELCOME).astype(np.float32) * np.float32(1e30)
    texts = [
        sdk(served).audio.transcriptions.create(file=("loud.wav", float_wav(samples)), model="whisper-1").text
        for samples in (loud, np.clip(loud, -1, 1))
    ]
    assert texts[0] == texts[1] and len(texts[0].split()) > 10, texts


def broken_midway() -> bytes:
    """The welcome as FLAC, a stretch a third of the way in zeroed: its header and first seconds
    decode, then libsndfile loses sync."""
    data = bytearray(flac(load_audio_file(WELCOME)))
    third = len(data) // 3
    data[third : third + 2000] = bytes(2000)
    return bytes(data)


def test_bad_oversize_and_unserved_requests_get_openai_errors_and_the_wire_goes_on(served):
    """A bystander streams on the WebSocket wire, same port and engine, while each bad request is answered."""
    client = sdk(served)
    with served.connect() as ws:
        stream(ws, load_audio_file(WELCOME))  # sent whole: transcribed while the bad requests come
        with pytest.raises(openai.BadRequestError) as bad:
            client.audio.transcriptions.create(
                file=("notes.wav", b"these are not samples"), model="whisper-1"
            )
        assert bad.value.code == "invalid_file" and "WAV" in bad.value.message
        noise = io.BytesIO()
        soundfile.write(noise, np.zeros(16000 * 40, np.float32), 16000, format="WAV")  # 1.2 MiB
        with pytest.raises(openai.APIStatusError) as large:
            client.audio.transcriptions.create(file=("long.wav", noise.getvalue()), model="whisper-1")
        assert large.value.status_code == 413 and large.value.code == "file_too_large"
        # Longer than a session may be (4 h), in a few hundred kB: refused unread.
        overlong_silence = ("silence.flac", flac(np.zeros(4000 * 15000, np.float32), 4000))
        with pytest.raises(openai.BadRequestError) as overlong:
            client.audio.transcriptions.create(file=overlong_silence, model="whisper-1")
        assert overlong.value.code == "audio_too_long" and "--max-session-seconds" in overlong.value.message
        slow = io.BytesIO()
        soundfile.write(slow, np.zeros(10_000, np.float32), 1, format="WAV", subtype="PCM_U8")
        with pytest.raises(openai.BadRequestError) as no_speech:
            client.audio.transcriptions.create(file=("slow.wav", slow.getvalue()), model="whisper-1")
        assert no_speech.value.code == "invalid_file" and "1 Hz" in no_speech.value.message
        many = {f"field{i}": "1" for i in range(40)}  # starlette's bound is ours to answer, as OpenAI's
        with pytest.raises(openai.BadRequestError) as form:
            client.audio.transcriptions.create(file=("w.wav", b"RIFF"), model="whisper-1", extra_body=many)
        assert form.value.code == "invalid_request" and "Too many fields" in form.value.message
        not_numbers = load_audio_file(WELCOME).astype(np.float32)
        not_numbers[16000:16100] = np.nan
        with pytest.raises(openai.BadRequestError) as nan:
            client.audio.transcriptions.create(file=("nan.wav", float_wav(not_numbers)), model="whisper-1")
        assert nan.value.code == "invalid_file" and "no number (NaN, infinity) 1.00 s in" in nan.value.message
        broken = ("broken.flac", broken_midway())
        with pytest.raises(openai.BadRequestError) as midway:
            client.audio.transcriptions.create(file=broken, model="whisper-1")
        assert midway.value.code == "invalid_file" and "lost sync" in midway.value.message
        with pytest.raises(openai.APIError) as streamed:
            list(client.audio.transcriptions.create(file=broken, model="whisper-1", stream=True))
        assert "lost sync" in streamed.value.message
        with pytest.raises(openai.BadRequestError) as task:
            client.audio.translations.create(file=("welcome.wav", WELCOME.read_bytes()), model="whisper-1")
        assert task.value.code == "unsupported_task"
        for options, code in [
            ({"response_format": "docx"}, "invalid_value"),
            ({"language": "fr"}, "unsupported_language"),
            ({"timestamp_granularities": ["word"]}, "invalid_value"),  # without verbose_json
            ({"response_format": "srt", "stream": True}, "invalid_value"),
        ]:
            with pytest.raises(openai.BadRequestError) as refused:
                transcribe(served, **options)
            assert refused.value.code == code, options
        done = events_until(ws, "transcription.done")[-1]
    assert word_error_rate(welcome_text(), done["text"]) <= 0.1
    wait_until(lambda: metric(served.port, "voxrt_utterances_active") == 0, 30)


def test_an_hour_of_silence_in_a_few_hundred_kb_is_decoded_as_it_is_fed(served):
    """A FLAC of silence decodes to far more than its bytes: decoded whole, an hour of it would
    hold all its samples in the server, twice over while they are joined. The welcome at its
    end shows the whole file was read; a live session beside it gets its text."""
    samples = load_audio_file(WELCOME)
    hour = flac(np.concatenate([np.zeros(3600 * 16000, np.float32), samples]))
    assert len(hour) < MAX_UPLOAD_MB << 20
    transcribe(served)  # warm: the server's caches and allocator at their working size
    with served.connect() as ws:
        memory = ResidentMemory(served.process.pid)
        stream(ws, samples)  # sent whole: transcribed while the hour is
        got = sdk(served).audio.transcriptions.create(
            file=("hour.flac", hour), model="whisper-1", response_format="verbose_json", timeout=300
        )
        rss = memory.stop()
        live = events_until(ws, "transcription.done")[-1]["text"]
    assert word_error_rate(welcome_text(), got.text) <= 0.1, got.text
    assert got.duration == pytest.approx(3600 + len(samples) / 16000, abs=0.01)
    print(f"server RSS {rss[0]:.0f} MB -> peak {max(rss):.0f} MB over {len(rss)} samples")
    assert len(rss) > 10 and max(rss) - rss[0] < 150, (rss[0], max(rss))
    assert word_error_rate(welcome_text(), live) <= 0.1, live


def test_a_live_session_and_uploads_at_once_each_get_their_own_text(served):
    """The same port, the same engine: a WebSocket session streams while two uploads run."""
    results: dict[str, str] = {}

    def upload(name: str) -> None:
        results[name] = transcribe(served).text

    uploads = [threading.Thread(target=upload, args=(f"upload-{i}",)) for i in range(2)]
    with served.connect() as ws:
        for thread in uploads:
            thread.start()
        stream(ws, load_audio_file(WELCOME))
        results["live"] = events_until(ws, "transcription.done")[-1]["text"]
    for thread in uploads:
        thread.join(timeout=120)
    assert sorted(results) == ["live", "upload-0", "upload-1"]
    for text in results.values():
        assert word_error_rate(welcome_text(), text) <= 0.1, results


def trickled_form(port: int) -> socket.socket:
    """A request whose form's first bytes come, and then no more."""
    head = (
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: voxrt\r\n"
        "Content-Type: multipart/form-data; boundary=XX\r\nContent-Length: 100000\r\n\r\n"
        '--XX\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'
    )
    connection = socket.create_connection(("127.0.0.1", port), timeout=60)
    connection.sendall(head.encode())
    return connection


def response_of(connection: socket.socket) -> bytes:
    """What the server answers, up to its close."""
    answer = b""
    while chunk := connection.recv(65536):
        answer += chunk
    return answer


def test_clients_trickling_their_forms_hold_no_seat_and_are_cut_off(served):
    """As many clients as there are seats (`--max-uploads` 2) send a form's first bytes and stop:
    an upload beside them is transcribed at once, and each of them gets 408 once it falls behind
    the pace a form must keep. A live session beside them gets its text."""
    with served.connect() as ws:
        stream(ws, load_audio_file(WELCOME))  # sent whole: transcribed while the forms trickle
        # Their bytes are in before the upload's connection opens: the server reads them first.
        trickling = [trickled_form(served.port) for _ in range(2)]
        assert word_error_rate(welcome_text(), transcribe(served).text) <= 0.1
        for connection in trickling:
            with connection:
                answer = response_of(connection)
            assert answer.startswith(b"HTTP/1.1 408") and b"upload_too_slow" in answer, answer
        live = events_until(ws, "transcription.done")[-1]["text"]
    assert word_error_rate(welcome_text(), live) <= 0.1, live


def test_keys_busy_and_a_client_gone_mid_stream(whisper_model, monkeypatch):
    """In process, to hold the engine: 401 without the key, 429 past the uploads at once, and
    an upload whose client leaves leaves nothing in the engine."""
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-test", max_uploads=1))
    base = f"{harness.http}/v1"
    wav = ("welcome.wav", WELCOME.read_bytes())
    gate, held = hold_steps(harness.engine, monkeypatch)
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).audio.transcriptions.create(
                file=wav, model="whisper-1"
            )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0)
        assert client.models.list().data
        first = client.audio.transcriptions.create(file=wav, model="whisper-1", stream=True)
        assert held.wait(30)  # the upload is in the engine, its steps held
        with pytest.raises(openai.RateLimitError) as busy:
            client.audio.transcriptions.create(file=wav, model="whisper-1")
        assert busy.value.response.headers["Retry-After"]
        assert len(harness.server.handles) == 1
        first.close()  # the client leaves mid-stream
        gate.set()
        wait_until(lambda: harness.engine.stats().utterances == 0 and not harness.server.handles, 30)
        assert client.audio.transcriptions.create(file=wav, model="whisper-1").text  # its seat is free
    finally:
        gate.set()
        harness.stop()


def test_voxrt_transcribe_writes_text_and_captions_from_a_server(served, tmp_path):
    base = [sys.executable, "-m", "realtime.cli", "transcribe", "--url", f"http://127.0.0.1:{served.port}"]
    text = subprocess.run([*base, str(WELCOME)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert word_error_rate(welcome_text(), text.stdout) <= 0.1, text.stdout
    srt_to_dir = [*base, "--format", "srt", "--output-dir", str(tmp_path), str(WELCOME)]
    captions = subprocess.run(srt_to_dir, capture_output=True, timeout=120)
    assert captions.returncode == 0, captions.stderr
    cues = list(srt.parse((tmp_path / "welcome.srt").read_text()))
    assert word_error_rate(welcome_text(), " ".join(c.content for c in cues)) <= 0.1
    french = [*base, "--language", "fr", str(WELCOME)]
    refused = subprocess.run(french, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "unsupported_language" in refused.stderr
    # A file the server fails as its text streams is named, and the next one is transcribed.
    broken = tmp_path / "not_numbers.wav"
    not_numbers = load_audio_file(WELCOME).astype(np.float32)
    not_numbers[16000 * 3 :] = np.nan
    broken.write_bytes(float_wav(not_numbers))
    both = subprocess.run([*base, str(broken), str(WELCOME)], capture_output=True, text=True, timeout=120)
    assert both.returncode == 1 and f"{broken}: invalid_file" in both.stderr and "no number" in both.stderr
    assert word_error_rate(welcome_text(), both.stdout.splitlines()[-1]) <= 0.1, both.stdout
    # To a directory: the failed file leaves no transcript that reads as done, the next its own.
    into = tmp_path / "texts"
    written = subprocess.run(
        [*base, "--output-dir", str(into), str(broken), str(WELCOME)], capture_output=True
    )
    assert written.returncode == 1 and sorted(p.name for p in into.iterdir()) == ["welcome.txt"]
    assert word_error_rate(welcome_text(), (into / "welcome.txt").read_text()) <= 0.1
    unwritable = subprocess.run(
        [*base, "--output-dir", str(broken / "texts"), str(WELCOME)], capture_output=True
    )
    assert unwritable.returncode == 2 and b"cannot write to" in unwritable.stderr, unwritable.stderr


@pytest.mark.slow
def test_voxrt_transcribe_starts_its_own_server_without_a_url():
    done = subprocess.run(
        [sys.executable, "-m", "realtime.cli", "transcribe", "--format", "vtt", str(WELCOME)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    cues = list(webvtt.from_buffer(io.StringIO(done.stdout)))
    assert word_error_rate(welcome_text(), " ".join(c.text for c in cues)) <= 0.1


def test_a_transcripts_language_is_named_as_whispers_tokenizer_names_it():
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    assert LANGUAGE_NAMES == LANGUAGES


@pytest.fixture(scope="module")
def two_voices(tmp_path_factory):
    """Two synthetic voices taking four turns, with who spoke when."""
    return conversation("two", synthetic_voices(tmp_path_factory.mktemp("voices")), 2, 4, seed=5)


def test_diarized_json_through_the_openai_sdk_names_each_voices_turns(served, two_voices, tmp_path):
    """OpenAI's `gpt-4o-transcribe-diarize` answer: a segment per run of one speaker's words,
    each timed and labelled; and `voxrt transcribe --speakers`, a line per turn."""
    file = ("two.flac", flac(two_voices.audio))
    got = sdk(served).audio.transcriptions.create(
        file=file, model="whisper-1", response_format="diarized_json"
    )
    assert isinstance(got, TranscriptionDiarized) and got.task == "transcribe"
    assert got.duration == pytest.approx(len(two_voices.audio) / 16000, abs=0.01)
    assert " ".join(s.text for s in got.segments).split() == got.text.split()
    assert_timed(got.segments, got.duration)
    assert all(s.type == "transcript.text.segment" for s in got.segments)
    assert [s.id for s in got.segments] == [f"seg_{i:03d}" for i in range(len(got.segments))]
    assert all(a.speaker != b.speaker for a, b in itertools.pairwise(got.segments))
    words = [
        TimedWord(word, s.start, s.end, 1.0, (), s.speaker) for s in got.segments for word in s.text.split()
    ]
    assert len({s.speaker for s in got.segments}) == 2
    assert word_accuracy(two_voices, words) >= 0.9
    (tmp_path / "two.flac").write_bytes(file[1])
    base = [sys.executable, "-m", "realtime.cli", "transcribe", "--url", f"http://127.0.0.1:{served.port}"]
    lines = subprocess.run([*base, "--speakers", str(tmp_path / "two.flac")], capture_output=True, text=True)
    assert lines.returncode == 0, lines.stderr
    said = [line.split(": ", 1) for line in lines.stdout.splitlines()]
    assert [(who, text.split()) for who, text in said] == [(s.speaker, s.text.split()) for s in got.segments]
