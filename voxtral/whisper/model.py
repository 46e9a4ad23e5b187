"""Whisper on any window length, with batched greedy decoding under Whisper's timestamp rules."""

import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from voxtral.errors import WeightsError
from voxtral.whisper import half_weights
from voxtral.whisper.decoder import StepDecoder
from voxtral.whisper.greedy import GreedyRow
from voxtral.whisper.hypothesis import SECONDS_PER_TIMESTAMP, Hypothesis, Segment
from voxtral.whisper.layers import load_whisper, read_json
from voxtral.whisper.logits import Suppress, SuppressAtStart, TimestampRules, apply

MULTILINGUAL_VOCAB_SIZE = 51865
TASKS = ("transcribe", "translate")
CPU_WEIGHTS = ("int8", "bfloat16")  # `WhisperModel`'s `cpu_weights`


class WhisperModel:
    """A Whisper checkpoint (transformers' layout) plus its tokenizer and special ids, English-only
    or multilingual."""

    def __init__(
        self, path: Path, device: torch.device, dtype: torch.dtype, cpu_weights: str | None = None
    ) -> None:
        """`cpu_weights` (CPU only, float32 models): what the layers that read a whole window
        (the encoder, and the decoder's projections of its states into cross-attention keys
        and values) compute with, where float32 products are the slow part of a decode:
        - `int8`: int8 weights per output channel, activations quantized on the fly, faster
          at the same offline WER (docs/models.md);
        - `bfloat16`: bfloat16 throughout, for CPUs that multiply it in hardware
          (`bfloat16.py`).
        The multilingual base keeps them float32 under either (docs/models.md).
        Either way the decoder's other linear layers and the vocabulary projection get float16
        weights (`half_weights.py`): at a few rows (decoding a token) float32 products are slow
        on a CPU. None: `dtype` throughout."""
        self.path = path  # the checkpoint directory
        config, generation = read_json(path / "config.json"), read_json(path / "generation_config.json")
        self.model = load_whisper(path, config, device, dtype)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise WeightsError(f"missing file {tokenizer_file}")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.device, self.dtype = device, dtype
        self.cpu_weights: str | None = None  # what the window's layers got; None: `dtype`
        dims = self.model.dims
        self.n_mels = dims.n_mels
        self.max_frames = dims.audio_positions * 2
        self.max_target_positions = dims.text_positions
        try:
            self.eot = generation["eos_token_id"]
            self.sot = generation["decoder_start_token_id"]
            self.no_timestamps = generation["no_timestamps_token_id"]
        except KeyError as exc:
            raise WeightsError(f"{path / 'generation_config.json'} lacks {exc}") from exc
        self.start_of_previous = self.tokenizer.token_to_id("<|startofprev|>")
        self.no_speech = self.no_timestamps - 1  # <|nocaptions|>, just before <|notimestamps|>
        self.timestamp_begin = self.no_timestamps + 1
        vocab = dims.vocab_size
        suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
        suppress[list(config.get("suppress_tokens") or [])] = True
        suppress[self.no_timestamps] = True
        begin_suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
        begin_suppress[list(config.get("begin_suppress_tokens") or [])] = True
        max_initial = generation.get("max_initial_timestamp_index") or 50
        self.rules = [
            SuppressAtStart(begin_suppress),
            Suppress(suppress),
            TimestampRules(self.timestamp_begin, self.eot, max_initial),
        ]
        # OpenAI's rule: the multilingual vocabulary is the larger one.
        self.multilingual = vocab >= MULTILINGUAL_VOCAB_SIZE
        self.language_ids = self._language_ids() if self.multilingual else {}
        self.task_ids = {task: self.tokenizer.token_to_id(f"<|{task}|>") for task in TASKS}
        if not generation.get("alignment_heads"):
            raise WeightsError(f"{path / 'generation_config.json'} lists no alignment_heads")
        if cpu_weights is not None:
            self._cpu_weights(cpu_weights)
        self.steps = StepDecoder(self.model.decoder, generation["alignment_heads"], self.encoder_dtype)

    def _language_ids(self) -> dict[str, int]:
        """Language tokens follow <|startoftranscript|>: <|en|>, <|zh|>, ... up to <|translate|>."""
        out, token = {}, self.sot + 1
        while (piece := self.tokenizer.id_to_token(token)) and re.fullmatch(r"<\|[a-z]{2,3}\|>", piece):
            out[piece[2:-2]] = token
            token += 1
        if not out:
            raise WeightsError("a multilingual Whisper tokenizer without language tokens")
        return out

    def prompt(
        self, language: str | None, task: str = "transcribe", previous: Sequence[int] = ()
    ) -> list[int]:
        """The tokens a decode starts with: text said before (`previous`, Whisper's prompt for
        names, terms and spelling), then <|startoftranscript|>; multilingual models are also
        told the language and the task."""
        before = [self.start_of_previous, *previous] if previous else []
        if not self.multilingual:
            return [*before, self.sot]
        return [*before, self.sot, self.language_ids[language or "en"], self.task_ids[task]]

    def previous_text(self, text: str, keyterms: tuple[str, ...] = ()) -> list[int]:
        """`text`, then the `keyterms` listed, as a prompt's tokens: its last ones, so that the
        prompt, the start of the transcript and a window's text fit the decoder's context
        (OpenAI's bound, half of it). The terms come last, where a long prompt keeps them."""
        terms = ", ".join(keyterms) + "." if keyterms else ""
        text = " ".join(part for part in (text.strip(), terms) if part)
        if not text:
            return []
        ids = self.tokenizer.encode(" " + text, add_special_tokens=False).ids
        return ids[-(self.max_target_positions // 2 - 1) :]

    @torch.inference_mode()
    def language_probabilities(self, encoder_states: torch.Tensor) -> torch.Tensor:
        """(rows, languages): each row's probability of each language token (in `language_ids`'
        order) after <|startoftranscript|>."""
        start = torch.full((encoder_states.shape[0], 1), self.sot, device=self.device)
        hidden, _ = self.steps.read(encoder_states, start)
        logits = self.model.proj_out(hidden[:, -1]).float()
        return torch.softmax(logits[:, list(self.language_ids.values())], dim=-1).cpu()

    def _cpu_weights(self, kind: str) -> None:
        if self.device.type != "cpu" or self.dtype != torch.float32:
            raise ValueError("int8 and bfloat16 Whisper are for float32 models on the CPU")
        if kind not in CPU_WEIGHTS:
            raise ValueError(f"Whisper's CPU weights are one of {CPU_WEIGHTS}, not {kind!r}")
        # The multilingual base keeps these float32: its German streamed lost words to either.
        if not self.multilingual:
            self.cpu_weights = kind
            self._window_weights(kind)
        # The decoder works on a batch of sessions, a token at a time: float16 weights, rows
        # computed on their own (`half_weights.py`); the window's layers, made above, are not
        # float32 linears and keep theirs. proj_out shares its weight with the token embedding;
        # only the projection gets them. Without the kernel, float32 stays.
        if half_weights.available():
            half_weights.half_weights(self.model.decoder)
            self.model.proj_out = half_weights.half_weights(self.model.proj_out)

    def _window_weights(self, kind: str) -> None:
        """The layers that read a whole window, the encoder and the decoder's projections of its
        states into cross-attention keys and values (`StepDecoder.start`), in `kind`."""
        if kind == "bfloat16":
            self.model.encoder.to(torch.bfloat16)
            for layer in self.model.decoder.layers:
                layer.encoder_attn.k_proj.to(torch.bfloat16)
                layer.encoder_attn.v_proj.to(torch.bfloat16)
            return
        # The encoder encodes one window at a time, and the projections project one window's
        # states at a time: the activations' one scale is the window's.
        cross = {"k_proj": per_channel_dynamic_qconfig, "v_proj": per_channel_dynamic_qconfig}
        with warnings.catch_warnings():  # torch.ao's eager API is deprecated for torchao, not a dependency
            warnings.simplefilter("ignore")
            quantize_dynamic(self.model.encoder, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
            for layer in self.model.decoder.layers:
                quantize_dynamic(layer.encoder_attn, cross, inplace=True)

    @property
    def encoder_dtype(self) -> torch.dtype:
        """The encoder's; its states are returned as `dtype`."""
        return torch.bfloat16 if self.cpu_weights == "bfloat16" else self.dtype

    @torch.inference_mode()
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """Encoder states for (batch, n_mels, frames) with frames even and at most 3000: windows
        shorter than 30 s too (`layers.Encoder`)."""
        return self.model.encoder(features.to(self.device, self.encoder_dtype)).to(self.dtype)

    @torch.inference_mode()
    def decode(
        self,
        encoder_states: torch.Tensor,
        max_new_tokens: list[int],
        forced: list[list[int]] | None = None,
        prompts: list[list[int]] | None = None,
        lengths: list[int] | None = None,
        drafts: list[list[int]] | None = None,
    ) -> list[Hypothesis]:
        """Greedy decoding with timestamps for a batch of windows, one KV cache for all rows.

        `forced` tokens are a row's known start (text it already committed for this
        window): they are read in one pass and decoding continues after them, after each
        row's `prompt` (default: English). Rows differ in length: they are left-padded,
        masked, and given their own positions; row i reads its first `lengths[i]` encoder
        states (None: all). A row that starts repeating itself stops there, the segment
        the repeat began in dropped (`GreedyRow`).

        A row's `draft` is a guess at what it will choose (the last decode of its window):
        read in the same first pass, its longest prefix that greedy decoding would choose
        is taken without a pass per token, and decoding goes on one token a pass from the
        first disagreement. The tokens are greedy decoding's whatever the draft: n-gram
        speculation whose draft costs nothing to make.
        """
        batch = len(max_new_tokens)
        forced = forced or [[] for _ in range(batch)]
        prompts = prompts or [self.prompt(None)] * batch
        drafts = [d[:n] for d, n in zip(drafts or [[] for _ in range(batch)], max_new_tokens, strict=True)]
        initial = [[*p, *f, *d] for p, f, d in zip(prompts, forced, drafts, strict=True)]
        width = max(len(ids) for ids in initial)
        input_ids = torch.full((batch, width), self.eot, dtype=torch.long)
        padding = torch.ones((batch, width), dtype=torch.bool)
        for row, ids in enumerate(initial):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            padding[row, width - len(ids) :] = False
        sot_index = [width - len(ids) + ids.index(self.sot) for ids in initial]
        input_ids, padding = input_ids.to(self.device), padding.to(self.device)
        positions = ((~padding).cumsum(-1) - 1).clamp(min=0)
        cache = self.steps.start(encoder_states, lengths, width + max(max_new_tokens))
        rows = [GreedyRow.after(f, n, self.eot) for f, n in zip(forced, max_new_tokens, strict=True)]
        hidden, weights = self.steps(cache, input_ids, positions, padding)
        # Row r's choice after k of its draft tokens is read at column last[r] + k. One
        # projection for every column the first pass decides on (a pass of one token costs
        # about what a pass of many does): each row's <|startoftranscript|>, for its no-speech
        # probability, then each row's choices.
        last = [width - len(d) - 1 for d in drafts]
        read = [(row, last[row] + k) for row in range(batch) for k in range(len(drafts[row]) + 1)]
        at = torch.tensor([*enumerate(sot_index), *read], device=self.device)
        scores = self.model.proj_out(hidden[at[:, 0], at[:, 1]]).float()
        no_speech_prob = torch.softmax(scores[:batch], dim=-1)[:, self.no_speech].tolist()
        heard = self._heard(weights[at[batch:, 0], :, at[batch:, 1]])
        accepted = self._verify(rows, drafts, scores[batch:], heard)
        for row, (first, taken) in enumerate(zip(last, accepted, strict=True)):
            cache.padding[row, first + 1 + taken : width] = True  # the rejected draft's columns
        # Each row goes on from its last choice, which no pass has read yet.
        next_ids = self._last_choices(rows)
        positions = torch.tensor(
            [len(ids) - len(d) + taken for ids, d, taken in zip(initial, drafts, accepted, strict=True)],
            device=self.device,
        )
        no_padding = torch.zeros((batch, 1), dtype=torch.bool, device=self.device)
        while not all(r.done for r in rows):
            hidden, weights = self.steps(cache, next_ids[:, None], positions[:, None], no_padding)
            going = [i for i, r in enumerate(rows) if not r.done]
            scores = self.model.proj_out(hidden[going, -1]).float()
            self._choose(rows, going, scores, self._heard(weights[going, :, -1]))
            next_ids = self._last_choices(rows)
            positions = positions + 1
        return [
            Hypothesis(
                r.tokens,
                self.segments(r.tokens),
                no_speech_prob[i],
                r.avg_logprob,
                len(forced[i]),
                r.frames,
                r.logprobs,
                r.looped,
            )
            for i, r in enumerate(rows)
        ]

    def _last_choices(self, rows: list[GreedyRow]) -> torch.Tensor:
        """Each row's last token (end of text for a row that is done): the next pass's input."""
        return torch.tensor([r.tokens[-1] if not r.done else self.eot for r in rows], device=self.device)

    @staticmethod
    def _heard(weights: torch.Tensor) -> list[int]:
        """For alignment weights (tokens, heads, frames), the frame the heads together attend to
        most from each token: where in the window it was heard."""
        return weights.mean(dim=1).argmax(dim=-1).tolist()

    def _choose(
        self, rows: list[GreedyRow], which: list[int], scores: torch.Tensor, heard: list[int]
    ) -> list[int]:
        """Rows `which` take their greedy choice from their next-token scores (len(which),
        vocabulary), masked in place by Whisper's rules; the choices."""
        apply(self.rules, scores, [rows[i].tokens for i in which])
        logprobs = torch.log_softmax(scores, dim=-1)
        chosen = scores.max(dim=-1).indices  # argmax's choice, the first of a tie, in fewer steps on a CPU
        chosen_logprob = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
        tokens = chosen.tolist()
        for j, i in enumerate(which):
            rows[i].take(tokens[j], heard[j], chosen_logprob[j])
        return tokens

    def _verify(
        self, rows: list[GreedyRow], drafts: list[list[int]], scores: torch.Tensor, heard: list[int]
    ) -> list[int]:
        """Each row's choices from the first pass (`scores` and `heard` for each row's columns in
        turn: after its known tokens, then after each draft token): how many draft tokens
        each row chose too."""
        offsets = [0]
        for draft in drafts:
            offsets.append(offsets[-1] + len(draft) + 1)
        accepted = [0] * len(rows)
        checking = list(range(len(rows)))
        for k in range(max(len(d) for d in drafts) + 1):
            checking = [i for i in checking if not rows[i].done]
            if not checking:
                break
            at = [offsets[i] + k for i in checking]
            tokens = self._choose(rows, checking, scores[at], [heard[j] for j in at])
            agreeing = []
            for i, token in zip(checking, tokens, strict=True):
                if not rows[i].done and k < len(drafts[i]) and token == drafts[i][k]:
                    accepted[i] += 1
                    agreeing.append(i)
            checking = agreeing
        return accepted

    @torch.inference_mode()
    def profile(self, frames: int, read: int, generated: int, rows: int) -> None:
        """A dummy decode's work (vLLM's profile run) for `rows` windows decoded together: the
        encoder over `frames` mel frames of silence for each, the decoder over `read` tokens a
        row in one pass, then `generated` one at a time."""
        silence = torch.zeros(1, self.n_mels, frames)
        states = torch.cat([self.encode(silence) for _ in range(rows)])  # each window alone, as served
        cache = self.steps.start(states, None, read + generated)
        ids = torch.full((rows, read), self.eot, dtype=torch.long, device=self.device)
        positions = torch.arange(read, device=self.device).expand(rows, read)
        padding = torch.zeros_like(ids, dtype=torch.bool)
        for _ in range(generated):
            hidden, _ = self.steps(cache, ids, positions, padding)
            torch.log_softmax(self.model.proj_out(hidden[:, -1]).float(), dim=-1)
            ids, positions, padding = ids[:, -1:], positions[:, -1:] + 1, padding[:, -1:]

    def segments(self, tokens: list[int]) -> list[Segment]:
        """Split timestamped tokens into segments; an unclosed last one has no end."""
        tb = self.timestamp_begin
        segments: list[Segment] = []
        start: float | None = None
        text_ids: list[int] = []
        for token in tokens:
            if token < tb:
                text_ids.append(token)
                continue
            time = (token - tb) * SECONDS_PER_TIMESTAMP
            if start is None:
                start = time
            else:
                segments.append(Segment(start, time, self.tokenizer.decode(text_ids)))
                start, text_ids = None, []
        if text_ids:
            segments.append(Segment(start or 0.0, None, self.tokenizer.decode(text_ids)))
        return segments
