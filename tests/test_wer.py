from benchmarks.text import whisper_wer, word_error_rate


def test_whisper_wer_scores_a_number_written_either_way_as_one_word():
    reference = "The last bus leaves at eleven, every ten minutes."
    assert word_error_rate(reference, "the last bus leaves at 11 every 10 minutes") == 2 / 9
    assert whisper_wer(reference, "The last bus leaves at 11, every 10 minutes.") == 0
    assert whisper_wer(reference, "the last bus leaves at 11 every 10 minute") == 1 / 9
