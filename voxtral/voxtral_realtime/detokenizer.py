"""Token ids to append-only text, one token at a time, equal to tekken's decode of the whole list."""

import codecs

from mistral_common.tokens.tokenizers.tekken import Tekkenizer


class Detokenizer:
    """O(1) per token: bytes go through an incremental UTF-8 decoder, so a character split
    across tokens comes out whole once its last byte arrives. tekken decodes each run of
    ordinary tokens on its own and drops special tokens, so a special token flushes the run.
    """

    def __init__(self, tekken: Tekkenizer) -> None:
        self.tekken = tekken
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        if token_id < self.tekken.num_special_tokens:
            return self.flush()
        return self._decoder.decode(self.tekken.id_to_byte_piece(token_id))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
