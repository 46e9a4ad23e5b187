import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxtral.whisper.hypothesis import Hypothesis, Segment
from voxtral.whisper.policy import WindowCommitter, drop_repetition


def hyp(*segments: tuple[float, float | None, str]) -> Hypothesis:
    return Hypothesis([], [Segment(s, e, t) for s, e, t in segments], 0.0, -0.1)


def test_commits_what_two_hypotheses_agree_on():
    agreement = WindowCommitter()
    assert agreement.update(hyp((0, None, " Good morning and")), False, False).text == ""
    commit = agreement.update(hyp((0, None, " Good morning, everyone.")), False, False)
    assert commit.text == "Good morning,"
    assert agreement.pending == ["everyone."]


def test_whole_segment_committed_moves_the_window():
    agreement = WindowCommitter()
    agreement.update(hyp((0, 2.0, " Good morning."), (2.0, None, " Today we")), False, False)
    commit = agreement.update(hyp((0, 2.0, " Good morning."), (2.0, None, " Today we will")), False, False)
    assert commit.text == "Good morning. Today we"
    assert commit.trim_seconds == 2.0
    assert agreement.window_words == ["Today", "we"]


def test_reworded_committed_words_are_realigned():
    agreement = WindowCommitter(window_words=["sea", "shells", "by"], pending=["the", "shore"])
    commit = agreement.update(hyp((0, None, " seashells by the shore today")), False, False)
    assert commit.text == "the shore"


def test_commit_all_commits_everything_and_keeps_it_as_context():
    agreement = WindowCommitter(window_words=["Thank"], pending=["you"])
    commit = agreement.update(hyp((0, None, " Thank you for listening.")), True, False, heard_words=1)
    assert commit.text == "you for listening." and not commit.clear and commit.interim == ""
    assert agreement.window_words == ["Thank", "you", "for", "listening."]


def test_local_agreement_commits_only_heard_words_and_shows_the_rest_as_interim():
    agreement = WindowCommitter()
    agreement.update(hyp((0, None, " Good morning, every")), False, False)
    commit = agreement.update(hyp((0, None, " Good morning, everyone here")), False, False, heard_words=1)
    assert commit.text == "Good" and commit.interim == "morning, everyone here"


def test_alignatt_commits_heard_words_at_once():
    agreement = WindowCommitter(agree=False)
    commit = agreement.update(hyp((0, None, " Good morning, every")), False, False, heard_words=2)
    assert commit.text == "Good morning," and commit.interim == "every"
    commit = agreement.update(
        hyp((0, None, " Good morning, everyone here today")), False, False, heard_words=4
    )
    assert commit.text == "everyone here" and commit.interim == "today"


def test_no_speech_clears_only_an_uncommitted_window():
    assert WindowCommitter().update(None, False, False).clear
    assert not WindowCommitter(window_words=["Hi"]).update(None, False, False).clear


def test_force_trim_commits_up_to_the_last_closed_segment():
    agreement = WindowCommitter()
    commit = agreement.update(hyp((0, 9.0, " One two."), (9.0, None, " three")), False, True)
    assert commit.text == "One two." and commit.trim_seconds == 9.0


def test_a_dropped_committed_word_loses_nothing():
    agreement = WindowCommitter(window_words=["The"], pending=["children", "played"])
    commit = agreement.update(hyp((0, None, " children played on the grass")), False, False)
    assert commit.text == "children played"


def test_a_corrected_last_word_is_not_repeated():
    agreement = WindowCommitter(window_words=["walk", "their", "nogs."], pending=["The", "children"])
    commit = agreement.update(hyp((0, None, " walk their dogs. The children played")), False, False)
    assert commit.text == "The children"


@given(
    st.lists(
        st.sampled_from(["the", "a", "sun", "came", "out", "dogs", "park", "we"]), min_size=1, max_size=30
    ),
    st.lists(st.integers(0, 4), min_size=1, max_size=20),
)
def test_a_steady_model_gets_every_word_committed_once(words, growth):
    """Hypotheses that only ever grow (a model that never changes its mind) lose and repeat nothing."""
    agreement = WindowCommitter()
    committed: list[str] = []
    heard = 0
    for step in growth:
        heard = min(len(words), heard + step)
        commit = agreement.update(hyp((0, None, " " + " ".join(words[:heard]))), False, False)
        committed += commit.text.split()
    commit = agreement.update(hyp((0, None, " " + " ".join(words))), True, False)
    committed += commit.text.split()
    assert committed == words


def test_a_segment_that_says_an_earlier_one_again_past_the_audio_is_dropped_with_what_follows():
    said = Segment(0.0, 7.0, " Last year we spent most of the money on repairs to the old school roof")
    again = Segment(7.0, 14.0, " The next part was the last year we spent most of the money on repairs")
    after = Segment(14.0, 15.0, " So there was little left.")
    assert drop_repetition([said, again, after], 2.4, audio_seconds=7.0) == [said]
    assert drop_repetition([said, again, after], 2.4, audio_seconds=7.4) == [said]
    assert drop_repetition([said, Segment(7.0, 9.0, " So there was little left.")], 2.4, 7.0)[-1].end == 9.0
    # Four words in a row again are speech, not a loop.
    other = Segment(7.0, 9.0, " We spent most of our afternoon outside.")
    assert drop_repetition([said, other], 2.4, 7.0) == [said, other]
    thanks = [Segment(0, 1, " Thank you."), Segment(1, 2, " Thank you.")]
    assert drop_repetition(thanks, 2.4, audio_seconds=1.0) == thanks[:1]


def test_what_is_said_twice_within_the_audio_is_kept():
    """People repeat themselves (Beckett's Endgame: "Do you hear me? Yes. Do you hear me? Yes.")."""
    dialogue = [Segment(0, 1, " Do you hear me?"), Segment(1, 2, " Yes."), Segment(2, 3, " Do you hear me?")]
    assert drop_repetition(dialogue, 2.4, audio_seconds=4.0) == dialogue
    story = [Segment(0, 2, " Are that's a good story."), Segment(2, 4, " Are that's a good story?")]
    assert drop_repetition(story, 2.4, audio_seconds=5.0) == story
    assert drop_repetition(story, 2.4, audio_seconds=2.2) == story[:1]


def test_words_a_trim_left_in_the_window_are_not_committed_again():
    """Whisper timed the segment's end early: the trimmed window still holds its last words."""
    committer = WindowCommitter(agree=False)
    said = " Last year there was very little left for the playground."
    assert committer.update(hyp((0, 7.0, said)), True, False).trim_seconds == 7.0
    assert committer.window_words == []
    again = committer.update(hyp((0, None, " left for the playground. The children walk")), False, False)
    assert again.text == "The children walk"
    assert committer.window_words == ["left", "for", "the", "playground.", "The", "children", "walk"]
    # Two words like the trimmed ones' last two are new speech.
    fresh = WindowCommitter(agree=False, trimmed=["for", "the", "playground."])
    assert fresh.update(hyp((0, 2.0, " The playground was closed.")), False, False).text == (
        "The playground was closed."
    )


def test_local_agreement_commits_a_word_heard_long_enough_though_no_hypothesis_agreed():
    agreement = WindowCommitter(pending=["Good", "evening"])
    commit = agreement.update(hyp((0, None, " Good morning, everyone here")), False, False, heard_words=3)
    assert commit.text == "Good" and commit.interim == "morning, everyone here"
    commit = agreement.update(
        hyp((0, None, " Good mourning, everyone there")), False, False, heard_words=3, settled_words=2
    )
    assert commit.text == "mourning," and commit.interim == "everyone there"


def test_a_trim_keeps_the_committed_segments_that_end_after_its_bound():
    """The next turn is heard after what was said before it: the window keeps its last seconds."""
    said = hyp((0, 5.0, " Do you hear me?"), (5.0, 9.0, " Yes."), (9.0, 13.0, " What are you talking about?"))
    committer = WindowCommitter(agree=False)
    commit = committer.update(said, True, False, trim_before=14.0 - 4.0)
    assert (commit.trim_seconds, commit.consumed_words) == (9.0, 5)
    assert committer.window_words == ["What", "are", "you", "talking", "about?"]
    assert WindowCommitter(agree=False).update(said, True, False, trim_before=0.0).trim_seconds == 0.0
    # A window too long to keep growing drops every committed segment, the bound or not.
    assert WindowCommitter(agree=False).update(said, True, True, trim_before=0.0).trim_seconds == 13.0


SAID = " so I was saying that we should go there on Sunday if the weather holds"
SPANS = [(0.5 * i, 0.5 * i + 0.4) for i in range(len(SAID.split()))]  # a word every 0.5 s


def test_a_long_open_segment_leaves_the_window_by_its_committed_words():
    """Whisper wrote the turn as one open segment, so none can leave the window: its committed
    words do, cut between two of them, and the next decode starts with a committed one."""
    agreement = WindowCommitter(window_words=SAID.split()[:10], pending=SAID.split()[10:12])
    asked = []
    commit = agreement.update(
        hyp((0, None, SAID)),
        False,
        False,
        trim_before=4.2,
        long_window_spans=lambda: asked.append(1) or SPANS,
    )
    assert commit.text == "Sunday if"  # agreed with the pending words, as before
    # Words 0-8 start by 4.2 s: the window keeps "there" (word 8) on, cut between "go" (ends
    # 3.9 s) and it (starts 4.0 s).
    assert commit.consumed_words == 8 and commit.trim_seconds == (3.9 + 4.0) / 2
    assert agreement.trimmed == SAID.split()[:8]
    assert agreement.window_words == ["there", "on", "Sunday", "if"]
    assert asked == [1]


def test_committed_words_leave_only_where_no_segment_can_and_never_the_last_one():
    closed = WindowCommitter(window_words=["Good", "morning."])
    commit = closed.update(
        hyp((0, 2.0, " Good morning."), (2.0, None, " Today we")),
        False,
        False,
        trim_before=3.0,
        long_window_spans=lambda: pytest.fail("a segment could leave: no alignment is asked"),
    )
    assert commit.trim_seconds == 2.0 and commit.consumed_words == 2
    # One committed word: it stays, the first word the next decode is forced.
    alone = WindowCommitter(window_words=["so"])
    spans = SPANS[:2]
    said = hyp((0, None, " so I"))
    commit = alone.update(said, False, False, trim_before=9.0, long_window_spans=lambda: spans)
    assert commit.trim_seconds == 0 and alone.window_words == ["so"]
    # Words the alignment counts otherwise are not placed: nothing leaves.
    other = WindowCommitter(window_words=SAID.split()[:10])
    five = SPANS[:5]
    commit = other.update(hyp((0, None, SAID)), False, False, trim_before=4.2, long_window_spans=lambda: five)
    assert commit.trim_seconds == 0 and other.window_words == SAID.split()[:10]
    # A decode that says fewer words than the window has committed (it dropped some) places
    # none of them: nothing leaves.
    short = WindowCommitter(window_words=SAID.split()[:10])
    said = hyp((0, None, " so I was saying that we"))
    commit = short.update(said, False, False, trim_before=4.2, long_window_spans=lambda: SPANS[:6])
    assert commit.trim_seconds == 0 and short.window_words == SAID.split()[:10]


def test_a_long_window_that_hears_none_of_its_new_words_twice_leaves_by_its_closed_segments():
    """The word trim left one committed word forced ("I"), and the alignment heads place every
    word the decoder says after it at the window's end: none is heard, nothing commits, and the
    window would grow to its force. Two such decodes of a long window trim it as a too-long one;
    a decode that hears a new word, or a window not long, is left to the usual rules."""
    said = hyp(
        (0, 1.0, " I didn't know he was there."), (1.0, 2.0, " This is Diane."), (2.0, None, " And I'm")
    )
    long_window = dict(trim_before=9.0, heard_words=1, long_window_spans=lambda: SPANS[:9])

    deaf = WindowCommitter(window_words=["I"])
    assert deaf.update(said, False, False, **long_window).text == ""
    commit = deaf.update(said, False, False, **long_window)
    assert commit.text == "didn't know he was there. This is Diane."
    assert commit.trim_seconds == 2.0 and deaf.window_words == [] and deaf.deaf_decodes == 0

    hearing = WindowCommitter(window_words=["I"])
    hearing.update(said, False, False, **long_window)
    hearing.update(said, False, False, **(long_window | {"heard_words": 2}))
    assert hearing.update(said, False, False, **long_window).text == ""  # one deaf decode since

    short = WindowCommitter(window_words=["I"])
    for _ in range(4):
        assert short.update(said, False, False, heard_words=1).text == ""
