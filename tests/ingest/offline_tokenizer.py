"""A small real tokenizer built offline with the `tokenizers` library (no downloads).

Word-level over whitespace and punctuation: every word of ``WORDS`` is one token,
anything else ``[UNK]``; a BOS ``<s>`` is added to every plain encode (like
Llama's tokenizers). With ``template=True`` a ``tokenizer_config.json`` next to
it carries a chat template and the BOS, as a Hugging Face model folder does.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.extras import require

WORDS = (
    "you are a helpful assistant answer the question below in one short sentence "
    "user system assistant what is capital of france spain italy why sky blue tell me "
    "story about cat dog s hello world"
).split()

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(folder: Path, *, template: bool = False) -> Path:
    """Write tokenizer.json (and tokenizer_config.json when ``template``); return the json."""
    require("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = ["[UNK]", "<s>", "</s>", "<|user|>", "<|system|>", "<|assistant|>", "<|end|>"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + WORDS + [":", "|", "<", ">"]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    if template:
        config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return path
