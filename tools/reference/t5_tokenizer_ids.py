#!/usr/bin/env python3
"""Expected T5 token ids for tests/data/text/t5_tokenizer_ids.json.

Runs on the project machine (no GPU, no network): Debian's python3-sentencepiece and
python3-protobuf (apt-get install python3-sentencepiece python3-protobuf; run with /usr/bin/python3).

Two independent computations of the ids, which must agree for every case before the JSON is
written:
  A. The SentencePiece library (the T5 tokenizer's original implementation): a ModelProto built
     with sentencepiece_model_pb2 from the HF tokenizer.json (pieces + scores, unk id 2, the
     Precompiled normalizer's charsmap as normalizer_spec.precompiled_charsmap, nmt_nfkc flags),
     then EncodeAsIds + </s>.
  B. A plain-Python reading of the HF pipeline: the charsmap's double-array trie searched by hand
     (longest match at each position, as SentencePiece's normalizer does), WhitespaceSplit,
     Metaspace ("▁" before each word), unigram Viterbi per word over the piece scores, unknown
     characters scored min_score - 10 and consecutive unknowns fused, then </s>.
The C++ tokenizer (src/text/t5_tokenizer.cpp) builds its model the way A does but in C++ (a
hand-written protobuf encoder), so B is what makes the expected ids independent of that route.

Usage: /usr/bin/python3 tools/reference/t5_tokenizer_ids.py models/tokenizers/t5/tokenizer.json.gz \
           tests/data/text/t5_tokenizer_ids.json
"""
import base64
import gzip
import json
import struct
import sys

CASES = [
    "Hello world",
    "",
    " ",
    "   \t\n  ",
    "a",
    "A photo of a cat",
    "a  photo   of\ta\ncat",
    "  leading and trailing spaces  ",
    "Hello, world! How are you?",
    "It's a test... isn't it?",
    "1234567890",
    "3.14159 and 2.71828",
    "2024-01-01 12:30:45",
    "$100 + 50% = ???",
    "café naïve résumé",
    "Ünïcödé ÀÉÎÕÜ",
    "Straße in München",
    "L'été est très chaud",
    "ＡＢＣ１２３ ｈｅｌｌｏ",
    "ｈｅｌｌｏ\u3000ｗｏｒｌｄ",
    "①②③ Ⅻ ㎏",
    "\ufb01ne \ufb02ower",
    "™ ½ x² H₂O",
    "e\u0301 vs \u00e9",
    "non-breaking\u00a0space and\u200bzero width",
    "“smart quotes” and ‘single’ — dash … ellipsis",
    "こんにちは世界",
    "你好，世界！",
    "🐱 cat emoji 🚀",
    "Привет мир",
    "Ωmega αβγ",
    "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 50,
    "https://example.com/path?q=1&r=two",
    "x = f(y) + 2*z; // comment",
    "CamelCaseWordsHere and snake_case_words",
    "UPPERCASE TEXT WITH NUMBERS 42",
    "masterpiece, best quality, 1girl, (blue eyes:1.2), long hair, [[detailed]]",
    "A majestic lion standing on a rocky cliff at sunset, cinematic lighting, 8k",
    "FLUX.1 [dev] model",
    "tab\tseparated\tvalues",
    "#hashtag @mention ~tilde^caret |pipe| {brace}",
]


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    unk = j["model"]["unk_id"]
    charsmap = base64.b64decode(j["normalizer"]["precompiled_charsmap"])
    return vocab, unk, charsmap


# ---------------------------------------------------------------- A: SentencePiece library
def sp_ids(vocab, unk, charsmap, texts):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    for i, (piece, score) in enumerate(vocab):
        p = m.pieces.add()
        p.piece = piece
        p.score = score
        if i == unk:
            p.type = pb.ModelProto.SentencePiece.UNKNOWN
        elif piece in ("<pad>", "</s>"):
            p.type = pb.ModelProto.SentencePiece.CONTROL
        elif piece.startswith("<extra_id_"):
            p.type = pb.ModelProto.SentencePiece.UNUSED
        else:
            p.type = pb.ModelProto.SentencePiece.NORMAL
    m.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    m.trainer_spec.vocab_size = len(vocab)
    m.trainer_spec.unk_id = unk
    m.trainer_spec.bos_id = -1
    m.trainer_spec.eos_id = 1
    m.trainer_spec.pad_id = 0
    m.normalizer_spec.name = "nmt_nfkc"
    m.normalizer_spec.precompiled_charsmap = charsmap
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = True
    m.normalizer_spec.escape_whitespaces = True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return [sp.EncodeAsIds(t) + [1] for t in texts]


# ---------------------------------------------------------------- B: plain Python
class Charsmap:
    def __init__(self, blob):
        (trie_bytes,) = struct.unpack_from("<I", blob, 0)
        n = trie_bytes // 4
        self.units = struct.unpack_from("<%dI" % n, blob, 4)
        self.strings = blob[4 + trie_bytes:]

    # Darts-clone unit fields.
    @staticmethod
    def has_leaf(u):
        return (u >> 8) & 1

    @staticmethod
    def value(u):
        return u & ((1 << 31) - 1)

    @staticmethod
    def label(u):
        return u & ((1 << 31) | 0xFF)

    @staticmethod
    def offset(u):
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    def prefixes(self, key):
        """(length, value) of every key prefix stored in the trie."""
        out = []
        pos = self.offset(self.units[0])
        for i, c in enumerate(key):
            pos ^= c
            u = self.units[pos]
            if self.label(u) != c:
                break
            pos ^= self.offset(u)
            if self.has_leaf(u):
                out.append((i + 1, self.value(self.units[pos])))
        return out

    def replacement(self, v):
        end = self.strings.index(b"\0", v)
        return self.strings[v:end]

    def normalize(self, text):
        b = text.encode("utf-8")
        out = bytearray()
        i = 0
        while i < len(b):
            m = self.prefixes(b[i:i + 64])
            if m:
                n, v = max(m)  # longest match
                out += self.replacement(v)
                i += n
            else:  # copy one UTF-8 character
                n = 1
                while i + n < len(b) and (b[i + n] & 0xC0) == 0x80:
                    n += 1
                out += b[i:i + n]
                i += n
        return out.decode("utf-8")


def py_ids(vocab, unk, charsmap, texts):
    cm = Charsmap(charsmap)
    piece_id = {}
    for i, (p, s) in enumerate(vocab):
        if i == unk or p in ("<pad>", "</s>") or p.startswith("<extra_id_"):
            continue
        piece_id[p] = i
    scores = [s for _, s in vocab]
    min_score = min(scores[i] for i in piece_id.values())
    unk_score = min_score - 10.0
    maxlen = max(len(p) for p in piece_id)
    res = []
    for t in texts:
        words = cm.normalize(t).split()
        ids = []
        for w in words:
            w = "\u2581" + w
            n = len(w)
            best = [(-1e30, -1, -1)] * (n + 1)  # (score, prev position, id)
            best[0] = (0.0, -1, -1)
            for i in range(n):
                if best[i][0] <= -1e29:
                    continue
                single = False
                for j in range(i + 1, min(n, i + maxlen) + 1):
                    pid = piece_id.get(w[i:j])
                    if pid is None:
                        continue
                    if j == i + 1:
                        single = True
                    s = best[i][0] + scores[pid]
                    if s > best[j][0]:
                        best[j] = (s, i, pid)
                if not single:
                    s = best[i][0] + unk_score
                    if s > best[i + 1][0]:
                        best[i + 1] = (s, i, unk)
            seq = []
            j = n
            while j > 0:
                _, i, pid = best[j]
                seq.append(pid)
                j = i
            seq.reverse()
            for pid in seq:
                if pid == unk and ids and ids[-1] == unk:
                    continue  # fuse consecutive unknowns
                ids.append(pid)
        res.append(ids + [1])
    return res


def main():
    vocab, unk, charsmap = load(sys.argv[1])
    a = sp_ids(vocab, unk, charsmap, CASES)
    b = py_ids(vocab, unk, charsmap, CASES)
    bad = [(t, x, y) for t, x, y in zip(CASES, a, b) if x != y]
    for t, x, y in bad:
        print("MISMATCH", repr(t), x, y, file=sys.stderr)
    if bad:
        sys.exit(1)
    out = {
        "source": "tools/reference/t5_tokenizer_ids.py: SentencePiece 0.1.97 (Debian python3-sentencepiece) on a "
                  "ModelProto built from models/tokenizers/t5/tokenizer.json, cross-checked against an independent "
                  "plain-Python charsmap + unigram implementation (all cases agree)",
        "cases": [{"text": t, "ids": x} for t, x in zip(CASES, a)],
    }
    with open(sys.argv[2], "w", encoding="utf-8") as f:  # one case per line
        f.write('{\n "source": %s,\n "cases": [\n' % json.dumps(out["source"]))
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in out["cases"]))
        f.write("\n ]\n}\n")
    print("wrote", len(CASES), "cases")


if __name__ == "__main__":
    main()
