"""Build a Hugging Face CLIP tokenizer from OpenAI's bpe_simple_vocab_16e6.txt.gz and dump token ids
for a set of varied prompts (tests/data/text/clip_tokenizer_cases.json).

vocab.json / merges.txt are derived the way openai/clip-vit-large-patch14's were (facts from
/work/shared/models/clip-bpe/SOURCE.md and OpenAI's simple_tokenizer.py):
  merges = lines [1 : 49152-256-2+1] of the unzipped file (48,894 merges; line 0 is a header)
  vocab  = the 256 byte-to-unicode characters (GPT-2 byte order), then the same 256 with "</w>",
           then "".join(merge) for every merge, then <|startoftext|> (49406), <|endoftext|> (49407).

Each case is {"text", "ids"} with ids = tokenizer(text)["input_ids"] (BOS ... EOS, no padding, no
truncation). When our own independent re-implementation of OpenAI's simple_tokenizer (without
ftfy, which is not installed on the GPU machine) gives different ids, they are stored as
"ids_openai" too, so the C++ side can see where the two reference behaviours part.
"""

import argparse
import gzip
import html
import json
import os

CASES = [
    "a photo of a cat",
    "A Photo Of A Cat",
    "a small red circle on the left, blue background",
    "a large green star in the centre, white background",
    "a purple triangle at the top, yellow background",
    "masterpiece, best quality, highly detailed, 8k, ultra realistic",
    "1024x768",
    "a 3d render of 42 cubes, 3.14159 and 1,000,000 stars",
    "don't stop, it's what we've done; they're sure I'm right, you'll see, he'd know",
    "DON'T SHOUT",
    "multiple    spaces   between     words",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nin text",
    "café naïve résumé façade",
    "Ελληνικά και русский текст",
    "猫",
    "一只可爱的猫 sitting on a mat",
    "日本語のテキスト",
    "한국어 텍스트",
    "emoji 😀 🐱 🚀 party 🎉",
    "👍🏽",
    "&amp; &lt;b&gt; &quot;quoted&quot; &#39;apos&#39;",
    "fish & chips <b>bold</b>",
    "(red:1.2) [blue] {green} ((very detailed)) (masterpiece:1.4)",
    "a cat, (wearing a hat:1.3), [[low quality]], <lora:style:0.8>",
    "BREAK a new chunk BREAK another",
    "!!!???...,,,;;;:::",
    "email@example.com http://example.com/path?x=1&y=2",
    "snake_case and kebab-case and CamelCaseWords",
    "hyphen-ated words and en–dash and em—dash",
    "quotes “curly” and ‘single’ and \"straight\"",
    "numbers 0 1 2 3 4 5 6 7 8 9 10 100 2024",
    "x1.5 upscaled 1.0e-3 -5 +7 50%",
    "$100 €50 £20 ¥1000",
    "#hashtag @mention ~tilde `backtick` ^caret",
    "a|b\\c/d",
    "",
    " ",
    "a",
    "<|startoftext|>",
    "<|endoftext|> after end",
    "the quick brown fox jumps over the lazy dog",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "photorealistic portrait of an astronaut riding a horse on mars, trending on artstation, octane render",
    "a watercolor painting of a lighthouse at dusk, soft pastel colors, by a famous artist",
    "ÀÉÎÕÜ upper case accents",
    "naïveté coöperate",
    "ñandú jalapeño",
    "Straße groß",
    "ﬁ ligature and ½ fraction and ² superscript",
    "zero\u200bwidth space",
    "non\u00a0breaking space",
    "control\u0007char",
    "a" * 40,
    "mixed123abc456def",
    "it'S DOn'T",
    "o'clock rock'n'roll",
    "a " * 80,
    " ".join(["a small red circle on the left, blue background"] * 4),
    "portrait, 1girl, solo, long hair, looking at viewer, smile, blue eyes, blonde hair, dress, "
    "standing, outdoors, sky, day, cloud, tree, blue sky, grass, flower, field, sunlight, wind, "
    "white dress, sundress, straw hat, flower field, landscape, scenery, masterpiece, best quality",
]


def bytes_to_unicode():
    """GPT-2 / CLIP reversible byte -> printable unicode character table (256 entries, fixed order)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def read_merges(gz_path):
    with gzip.open(gz_path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]
    assert len(merges) == 48894, len(merges)
    return [tuple(m.split()) for m in merges]


def write_tokenizer_files(gz_path, out_dir):
    """Write vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    merges = read_merges(gz_path)
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408
    enc = {t: i for i, t in enumerate(vocab)}
    assert len(enc) == 49408, "duplicate vocab entries"
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(enc, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
               "pad_token": "<|endoftext|>"}
    cfg = dict(special, model_max_length=77, do_lower_case=True, errors="replace", tokenizer_class="CLIPTokenizer")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=1)
    return enc, merges


def load_hf_tokenizer(tok_dir):
    """transformers' CLIPTokenizer from tok_dir (model_max_length 77)."""
    from transformers import CLIPTokenizer

    try:
        return CLIPTokenizer.from_pretrained(tok_dir, model_max_length=77)
    except Exception as e:  # noqa: BLE001  (fallback: build it from the vocab/merges directly)
        print("CLIPTokenizer.from_pretrained failed:", e)
        with open(os.path.join(tok_dir, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        with open(os.path.join(tok_dir, "merges.txt"), encoding="utf-8") as f:
            merges = [tuple(m.split()) for m in f.read().strip().split("\n")[1:]]
        return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


class OpenAISimpleTokenizer:
    """Our re-implementation of OpenAI CLIP's simple_tokenizer.py behaviour (minus ftfy.fix_text):
    html-unescape twice, strip, collapse whitespace, lower-case, regex split, byte-level BPE."""

    def __init__(self, enc, merges):
        import regex

        self.enc = enc
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.b2u = bytes_to_unicode()
        self.pat = regex.compile(
            r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            regex.IGNORECASE)
        self.ws = regex.compile(r"\s+")

    def bpe(self, token):
        word = list(token[:-1]) + [token[-1] + "</w>"]
        while len(word) > 1:
            pairs = [(self.ranks.get((word[i], word[i + 1]), 1 << 30), i) for i in range(len(word) - 1)]
            best = min(pairs)
            if best[0] == 1 << 30:
                break
            a, b = word[best[1]], word[best[1] + 1]
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def encode(self, text):
        text = html.unescape(html.unescape(text)).strip()
        text = self.ws.sub(" ", text).strip().lower()
        ids = [49406]
        for tok in self.pat.findall(text):
            if tok in ("<|startoftext|>", "<|endoftext|>"):
                ids.append(self.enc[tok])
                continue
            u = "".join(self.b2u[b] for b in tok.encode("utf-8"))
            ids.extend(self.enc[p] for p in self.bpe(u))
        return ids + [49407]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gz", required=True)
    ap.add_argument("--tok-dir", required=True, help="where to write the HF tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta-out", required=True, help="JSON with tokenizer class and versions")
    a = ap.parse_args()
    enc, merges = write_tokenizer_files(a.gz, a.tok_dir)
    tok = load_hf_tokenizer(a.tok_dir)
    ids = tok("a photo of a cat")["input_ids"]
    assert ids == [49406, 320, 1125, 539, 320, 2368, 49407], ids
    ours = OpenAISimpleTokenizer(enc, merges)
    cases, ndiff = [], 0
    for text in CASES:
        c = {"text": text, "ids": tok(text)["input_ids"]}
        o = ours.encode(text)
        if o != c["ids"]:
            c["ids_openai"] = o
            ndiff += 1
        cases.append(c)
    import transformers

    try:
        import ftfy  # noqa: F401
        has_ftfy = True
    except ImportError:
        has_ftfy = False
    meta = {"tokenizer_class": type(tok).__module__ + "." + type(tok).__name__,
            "transformers_version": transformers.__version__, "ftfy_installed": has_ftfy,
            "note": "ids = transformers CLIPTokenizer(text)['input_ids'] (BOS/EOS, no padding/truncation); "
                    "ids_openai only where our re-implementation of OpenAI simple_tokenizer (no ftfy) differs"}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
    with open(a.meta_out, "w") as f:
        json.dump(meta, f, indent=1)
    print(f"tokens: {len(cases)} cases, {ndiff} differ from the OpenAI-style re-implementation; {meta}")


if __name__ == "__main__":
    main()
