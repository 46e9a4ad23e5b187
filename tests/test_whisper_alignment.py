"""The step decoder against transformers' own eager decoder: its hidden states and the
alignment heads' attention; and which words of a hypothesis count as heard."""

import torch
from transformers import WhisperForConditionalGeneration

from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.words import TokenWords, split_words


def test_step_decoder_and_its_alignment_weights_equal_the_eager_decoder(whisper_dir, whisper_float32):
    eager = WhisperForConditionalGeneration.from_pretrained(whisper_dir, attn_implementation="eager").eval()
    torch.manual_seed(0)
    states = whisper_float32.encode(torch.randn(2, whisper_float32.n_mels, 1000))
    ids = torch.tensor(
        [[whisper_float32.sot, 50364, 1374, 3329, 11], [whisper_float32.sot, 50364, 383, 1200, 373]]
    )
    with torch.inference_mode():
        hidden, ours = whisper_float32.steps.read(states, ids)
        reference = eager.model.decoder(input_ids=ids, encoder_hidden_states=states, output_attentions=True)
    heads = eager.generation_config.alignment_heads
    expected = torch.stack([reference.cross_attentions[layer][:, head] for layer, head in heads], dim=1)
    assert ours.shape == expected.shape == (2, len(heads), 5, 500)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(hidden, reference.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_words_heard_stop_at_the_first_token_heard_too_late(whisper_model):
    m = whisper_model
    tokens = m.tokenizer.encode(" Good morning, everyone here", add_special_tokens=False).ids
    pieces = [m.tokenizer.decode([t]) for t in tokens]
    words = ["Good", "morning,", "everyone", "here"]
    forced = [m.timestamp_begin, *tokens[:1]]  # "<|0.00|> Good" committed before
    generated = tokens[1:]
    # The word each generated token belongs to (plain reference: count the spaces).
    word_of, w = [], 0
    for piece in pieces[1:]:
        w += piece.startswith(" ")
        word_of.append(w)
    for cut in range(len(generated) + 1):
        frames = [10 * (i + 1) if i < cut else 999 for i in range(len(generated))]
        hyp = Hypothesis(forced + generated, [], 0.0, 0.0, len(forced), frames)
        heard = TokenWords(m.tokenizer, m.timestamp_begin, spaced=True).words_heard(hyp, before_frame=500)
        # Words all of whose tokens come before the cut, and the cut token starts a new word.
        complete = 1 + sum(
            1 for k in range(1, len(words)) if all(c < cut for c, wo in enumerate(word_of) if wo == k)
        )
        assert heard == complete, (cut, pieces, heard, complete)


def test_an_opening_timestamp_the_heads_place_late_does_not_stop_the_words_heard(whisper_model):
    """The heads attend from a window's opening timestamp to wherever, often the window's end: a
    window with nothing forced whose opening they placed there heard no word, and grew to 24 s
    uncommitted. A closing timestamp placed late still holds the words after it."""
    m = whisper_model
    said = m.tokenizer.encode(" Oh hello, I didn't know", add_special_tokens=False).ids
    closed = m.tokenizer.encode(" you were there.", add_special_tokens=False).ids
    tokens = [m.timestamp_begin, *said, m.timestamp_begin + 80, m.timestamp_begin + 80, *closed]
    late = 854  # where the heads put the opening timestamp of a 17 s window of the real call
    words = TokenWords(m.tokenizer, m.timestamp_begin, spaced=True)
    heard_said = len(split_words(" Oh hello, I didn't know", spaced=True))
    for closing, expected in ((300, heard_said + 2), (late, heard_said)):
        frames = [late] + [40 + 10 * i for i in range(len(said))] + [closing] * 2 + [400, 410, 420, 999]
        hyp = Hypothesis(tokens, [], 0.0, 0.0, 0, frames)
        assert words.words_heard(hyp, before_frame=731) == expected, closing


def test_unspaced_words_are_characters_counted_on_tokens(whisper_model):
    """Japanese: each character is a word; a token may hold part of one, or several."""
    m = whisper_model
    text = "おはようございます。私は田中です。よろしくお願いします。"
    tokens = m.tokenizer.encode(text, add_special_tokens=False).ids
    assert len(tokens) != len(text), "the test needs tokens that are not one character each"
    words = TokenWords(m.tokenizer, m.timestamp_begin, spaced=False)
    assert split_words(text, spaced=False) == list(text)
    assert sum(count for count, _ in words.word_starts(tokens)) == len(text)
    for cut in range(len(tokens) + 1):
        frames = [10 if i < cut else 999 for i in range(len(tokens))]
        hyp = Hypothesis(tokens, [], 0.0, 0.0, 0, frames)
        # Plain reference: the characters the tokens before the cut decode to whole.
        whole = m.tokenizer.decode(tokens[:cut]).replace("\ufffd", "")
        assert words.words_heard(hyp, before_frame=500) == len(whole), (cut, whole)
    for keep in range(1, len(text)):
        prefix = words.window_prefix([m.timestamp_begin, *tokens], 0, keep, 0.0)
        assert prefix[0] == m.timestamp_begin
        decoded = m.tokenizer.decode(prefix[1:])
        assert decoded.startswith(text[:keep]) and "\ufffd" not in decoded, (keep, decoded)
