"""The page at `/` in a real browser: Debian's chromium, driven by Playwright, with a speech
file as its microphone (Playwright's own browsers are never downloaded)."""

import base64
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
import srt
from playwright.sync_api import expect, sync_playwright

from benchmarks.conversations import conversation, synthetic_voices
from benchmarks.text import word_error_rate
from realtime.config import ServerConfig
from tests.conftest import SAMPLES, espeak
from tests.server_harness import ServerThread
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.runner import WhisperRunner

SPOKEN = "The library opens in the morning and closes in the evening. You can borrow many books for a while."


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is needed: bash scripts/setup.sh installs it")
    return path


@pytest.mark.slow
def test_page_transcribes_the_microphone(whisper_model, tmp_path):
    speech = tmp_path / "speech.wav"
    espeak(SPOKEN, tmp_path / "raw.wav")
    # The fake microphone plays the file once; the silence after it lets the last words end.
    subprocess.run(["sox", str(tmp_path / "raw.wav"), str(speech), "pad", "1", "4"], check=True)
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-page"), max_sessions=4)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium(),
                args=[
                    "--use-fake-ui-for-media-stream",
                    "--use-fake-device-for-media-stream",
                    f"--use-file-for-fake-audio-capture={speech}%noloop",
                    "--autoplay-policy=no-user-gesture-required",
                ],
            )
            page = browser.new_page()
            page.goto(harness.http + "/")
            page.fill("#key", "sk-page")  # sent as the subprotocol OpenAI's browser clients use
            page.click("#start")
            expect(page.locator("#status")).to_have_text("listening", timeout=20_000)
            expect(page.locator("#text")).to_contain_text("borrow", timeout=60_000, ignore_case=True)
            page.click("#start")  # stop: the final commit
            expect(page.locator("#status")).to_have_text("done", timeout=30_000)
            text = page.locator("#text").text_content()
            # Each word a span with its time and confidence; a click plays it from its start.
            words = page.locator("#text .word")
            starts = [float(words.nth(i).get_attribute("data-start")) for i in range(words.count())]
            assert len(starts) == len(text.split()) and starts == sorted(starts), (text, starts)
            opacities = [float(words.nth(i).evaluate("e => e.style.opacity")) for i in range(words.count())]
            unsure = [
                words.nth(i).evaluate("e => e.classList.contains('unsure')") for i in range(words.count())
            ]
            assert all(0.45 <= o <= 1 for o in opacities) and unsure == [
                o < 0.45 + 0.55 * 0.5 for o in opacities
            ]
            words.filter(has_text="borrow").first.click()
            expect(page.locator("#status")).to_have_text(re.compile(r"playing from \d+\.\d\d s"))
            page.set_viewport_size({"width": 900, "height": 420})
            page.screenshot(path=str(tmp_path / "page.png"))
            browser.close()
        for word in ("library", "opens", "morning", "evening", "borrow", "books"):
            assert word in text.lower(), text
    finally:
        harness.stop()
    assert Path(tmp_path / "page.png").stat().st_size > 0


@pytest.mark.slow
def test_a_dropped_file_is_transcribed_and_its_captions_download(whisper_model, welcome):
    _, text = welcome
    wav = (SAMPLES / "welcome.wav").read_bytes()
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(api_key="sk-page"), max_sessions=4)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium())
            page = browser.new_page(accept_downloads=True)
            page.goto(harness.http + "/")
            page.fill("#key", "sk-page")
            dropped = page.evaluate_handle(
                """(b64) => {
                    const transfer = new DataTransfer();
                    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                    transfer.items.add(new File([bytes], "welcome.wav", { type: "audio/wav" }));
                    return transfer;
                }""",
                base64.b64encode(wav).decode(),
            )
            page.dispatch_event("#transcript", "drop", {"dataTransfer": dropped})
            expect(page.locator("#status")).to_have_text(
                re.compile(r"done: welcome.wav, 12.0 s"), timeout=60_000
            )
            shown = page.locator("#text").text_content()
            words = page.locator("#text .word")
            starts = [float(words.nth(i).get_attribute("data-start")) for i in range(words.count())]
            assert len(starts) == len(shown.split()) and starts == sorted(starts)
            with page.expect_download() as download:
                page.click("#srt")
            captions = list(srt.parse(Path(download.value.path()).read_text()))
            browser.close()
    finally:
        harness.stop()
    assert word_error_rate(text, shown) <= 0.1, shown
    assert " ".join(c.content.replace("\n", " ") for c in captions) == shown
    assert [c.start.total_seconds() for c in captions] == sorted(c.start.total_seconds() for c in captions)


@pytest.mark.slow
def test_who_spoke_colours_each_speakers_words_and_names_them_in_the_captions(whisper_model, tmp_path):
    talk = conversation("page", synthetic_voices(tmp_path), 2, 4, seed=3)
    speech = tmp_path / "talk.wav"
    soundfile.write(speech, np.concatenate([talk.audio, np.zeros(3 * SAMPLE_RATE, np.float32)]), SAMPLE_RATE)
    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig(), max_sessions=4)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium(),
                args=[
                    "--use-fake-ui-for-media-stream",
                    "--use-fake-device-for-media-stream",
                    f"--use-file-for-fake-audio-capture={speech}%noloop",
                ],
            )
            page = browser.new_page(accept_downloads=True)
            page.goto(harness.http + "/")
            page.check("#speakers")
            page.click("#start")
            expect(page.locator("#status")).to_have_text("listening", timeout=20_000)
            # Both voices heard: the second speaker's first words are labelled.
            expect(page.locator('#text .word[data-speaker="S2"]').first).to_be_visible(timeout=120_000)
            page.click("#start")
            expect(page.locator("#status")).to_have_text("done", timeout=30_000)
            words = page.locator("#text .word")
            labelled = [
                (words.nth(i).get_attribute("data-speaker"), words.nth(i).evaluate("e => e.style.color"))
                for i in range(words.count())
            ]
            with page.expect_download() as download:
                page.click("#srt")
            captions = list(srt.parse(Path(download.value.path()).read_text()))
            browser.close()
    finally:
        harness.stop()
    colours = dict(labelled)
    assert set(colours) == {"S1", "S2"} and colours["S1"] != colours["S2"], labelled
    assert all(c.content.startswith(("S1: ", "S2: ")) for c in captions), captions
