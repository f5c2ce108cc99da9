"""keras_birnn.data.readers: read_conll, read_conllu_column, read_tagged_lines,
read_tsv and the DataFormatError every reader raises, on small files written
here. Plain Python (no TensorFlow), the same on every backend."""

import itertools
import pickle

import pytest

from keras_birnn.data import readers
from keras_birnn.data.readers import (
    DataFormatError,
    parse_conll,
    read_columns,
    read_conll,
    read_conllu,
    read_conllu_column,
    read_lines,
    read_polarity,
    read_tagged_lines,
    read_tsv,
)
from keras_birnn.tagging.spans import spans

# CoNLL-2003 layout (word POS chunk NER), IOB1 tags, a -DOCSTART- line, two
# blank lines between sentences, CRLF ends and no final blank line.
NER = (
    "-DOCSTART- -X- -X- O\r\n"
    "\r\n"
    "EU NNP I-NP I-ORG\r\n"
    "rejects VBZ I-VP O\r\n"
    "German JJ I-NP I-MISC\r\n"
    "call NN I-NP O\r\n"
    "\r\n"
    "\r\n"
    "Peter NNP I-NP I-PER\r\n"
    "Blackburn NNP I-NP I-PER\r\n"
    "\r\n"
    "S.\u00e3o NNP I-NP I-LOC\r\n"
    "Paulo NNP I-NP I-LOC\r\n"
    "Rio NNP I-NP B-LOC"
)
NER_SENTENCES = [
    {"tokens": ["EU", "rejects", "German", "call"], "pos": ["NNP", "VBZ", "JJ", "NN"],
     "tags": ["I-ORG", "O", "I-MISC", "O"]},
    {"tokens": ["Peter", "Blackburn"], "pos": ["NNP", "NNP"], "tags": ["I-PER", "I-PER"]},
    {"tokens": ["S.\u00e3o", "Paulo", "Rio"], "pos": ["NNP", "NNP", "NNP"], "tags": ["I-LOC", "I-LOC", "B-LOC"]},
]
COLUMNS = {"tokens": 0, "pos": 1, "tags": -1}

CONLLU = (
    "# sent_id = 1\n"
    "1-2\tdu\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "1\tde\tde\tADP\tP\t_\t3\tcase\t_\t_\n"
    "2\tle\tle\tDET\tDA\tDefinite=Def|Gender=Masc|Number=Sing\t3\tdet\t_\t_\n"
    "3\tchat\tchat\tNOUN\tNC\tGender=Masc|Number=Sing\t0\troot\t_\tSpaceAfter=No\n"
    "\n"
    "# sent_id = 2\n"
    "1\tIls\til\tPRON\tCLS\tNumber=Plur|Person=3\t2\tnsubj\t_\t_\n"
    "2\tdorment\tdormir\tVERB\tV\tMood=Ind|Number=Plur\t0\troot\t_\t_\n"
    "2.1\tdorment\tdormir\tVERB\tV\t_\t_\t_\t2:conj\t_\n"
)


def write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


def test_read_conll_columns_docstart_crlf_and_no_final_blank_line(tmp_path):
    path = write(tmp_path, "train.conll", NER)
    assert read_conll(path, COLUMNS) == NER_SENTENCES
    # The default columns: first and last.
    assert read_conll(str(path)) == [{"tokens": s["tokens"], "tags": s["tags"]} for s in NER_SENTENCES]
    # Every column by a positive index; the chunk column (2) as well.
    chunks = read_conll(path, {"tokens": 0, "chunk": 2})
    assert [s["chunk"] for s in chunks] == [["I-NP", "I-VP", "I-NP", "I-NP"], ["I-NP"] * 2, ["I-NP"] * 3]
    # The new reader agrees with the older tuple reader.
    assert [(s["tokens"], s["tags"]) for s in read_conll(path)] == read_columns(path)


def test_read_conll_converts_schemes(tmp_path):
    path = write(tmp_path, "train.conll", NER)
    iob2 = read_conll(path, COLUMNS, scheme="iob1", to_scheme="iob2")
    assert [s["tags"] for s in iob2] == [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"], ["B-LOC", "I-LOC", "B-LOC"]]
    bioes = read_conll(path, COLUMNS, scheme="IOB1", to_scheme="bioes")
    assert [s["tags"] for s in bioes] == [
        ["S-ORG", "O", "S-MISC", "O"], ["B-PER", "E-PER"], ["B-LOC", "E-LOC", "S-LOC"]]
    assert [s["tokens"] for s in bioes] == [s["tokens"] for s in NER_SENTENCES]
    # A scheme alone checks the tags and leaves them as they are.
    assert read_conll(path, COLUMNS, scheme="iob1") == NER_SENTENCES
    with pytest.raises(ValueError, match="to_scheme"):
        read_conll(path, to_scheme="iob2")
    with pytest.raises(ValueError, match="scheme"):
        read_conll(path, scheme="bilou")
    with pytest.raises(ValueError, match="'tags' column"):
        read_conll(path, {"tokens": 0}, scheme="iob2")
    with pytest.raises(ValueError, match="at least one column"):
        read_conll(path, {})


def brute_force_spans(tags):
    """Spans by the definition, written independently of tagging.spans: a
    tag continues the span before it when it is I-X (or E-X) after a B-X,
    I-X of the same type that did not close it (E-X, S-X close one)."""
    found, current = [], None
    for i, tag in enumerate(tags + ["O"]):
        prefix, _, kind = tag.partition("-")
        continues = (current is not None and prefix in ("I", "E") and kind == current[0]
                     and tags[i - 1][0] not in ("E", "S"))
        if current is not None and not continues:
            found.append((current[0], current[1], i))
            current = None
        if prefix != "O" and not continues:
            current = (kind, i)
    return found


def written(found, length, scheme):
    """IOB2 or BIOES tags of spans `(type, start, end)`: B-X first, I-X
    after; under BIOES S-X for one tag and E-X last."""
    tags = ["O"] * length
    for kind, start, end in found:
        tags[start:end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        if scheme == "bioes":
            tags[end - 1] = f"{'S' if end - start == 1 else 'E'}-{kind}"
    return tags


def test_scheme_round_trip_keeps_every_span(tmp_path):
    # Every IOB1 sequence of length 4 over O, I-A, B-A, I-B (a B-X only
    # where it may stand: right after X), written as a file, read through
    # iob1 -> iob2 -> bioes -> iob2.
    alphabet = ["O", "I-A", "B-A", "I-B"]
    cases = [list(t) for t in itertools.product(alphabet, repeat=4)
             if all(tag != "B-A" or (i and t[i - 1] in ("I-A", "B-A")) for i, tag in enumerate(t))]
    assert len(cases) > 50
    text = "\n\n".join("\n".join(f"w{i} {tag}" for i, tag in enumerate(tags)) for tags in cases)
    iob1 = write(tmp_path, "iob1.txt", text)
    iob2 = read_conll(iob1, scheme="iob1", to_scheme="iob2")
    iob2_path = write(tmp_path, "iob2.txt", "\n\n".join(
        "\n".join(f"{t} {g}" for t, g in zip(s["tokens"], s["tags"])) for s in iob2))
    bioes = read_conll(iob2_path, scheme="iob2", to_scheme="bioes")
    bioes_path = write(tmp_path, "bioes.txt", "\n\n".join(
        "\n".join(f"{t} {g}" for t, g in zip(s["tokens"], s["tags"])) for s in bioes))
    back = read_conll(bioes_path, scheme="bioes", to_scheme="iob2")
    assert back == iob2
    for tags, a, b in zip(cases, iob2, bioes):
        expected = brute_force_spans(tags)
        assert [tuple(s) for s in spans(tags, "iob1")] == expected, tags
        assert [tuple(s) for s in spans(a["tags"], "iob2")] == expected, tags
        assert [tuple(s) for s in spans(b["tags"], "bioes")] == expected, tags
        # Written as each scheme writes those spans, tag by tag.
        assert a["tags"] == written(expected, len(tags), "iob2"), tags
        assert b["tags"] == written(expected, len(tags), "bioes"), tags


def test_read_conllu_column(tmp_path):
    path = write(tmp_path, "fr.conllu", CONLLU)
    tokens = [["de", "le", "chat"], ["Ils", "dorment"]]
    expected = {
        "upos": [["ADP", "DET", "NOUN"], ["PRON", "VERB"]],
        "xpos": [["P", "DA", "NC"], ["CLS", "V"]],
        "deprel": [["case", "det", "root"], ["nsubj", "root"]],
        "lemma": [["de", "le", "chat"], ["il", "dormir"]],
        "feats:Number": [["_", "Sing", "Sing"], ["Plur", "Plur"]],
        "feats:Gender": [["_", "Masc", "Masc"], ["_", "_"]],
        "misc:SpaceAfter": [["_", "_", "No"], ["_", "_"]],
    }
    for column, tags in expected.items():
        assert read_conllu_column(path, column) == [{"tokens": t, "tags": g} for t, g in zip(tokens, tags)], column
    assert read_conllu_column(path) == read_conllu_column(path, "upos")
    # The tuple reader reads the same words.
    assert [(s[0], s[1]) for s in read_conllu(path)] == list(zip(tokens, expected["upos"]))
    for column in ("feats", "upos:Number", "feats:", "case"):
        if column == "feats":
            assert read_conllu_column(path, column)[0]["tags"][1] == "Definite=Def|Gender=Masc|Number=Sing"
        else:
            with pytest.raises(ValueError, match="column"):
                read_conllu_column(path, column)


def test_read_tagged_lines_and_tsv(tmp_path):
    tagged = write(tmp_path, "train.tagged", "Dogs bark\tNOUN VERB\r\n\nThe  cat sat\tDET NOUN VERB")
    assert read_tagged_lines(tagged) == [
        {"tokens": ["Dogs", "bark"], "tags": ["NOUN", "VERB"]},
        {"tokens": ["The", "cat", "sat"], "tags": ["DET", "NOUN", "VERB"]},
    ]
    bar = write(tmp_path, "bar.tagged", "Dogs bark|NOUN VERB\n")
    assert read_tagged_lines(bar, delimiter="|")[0]["tags"] == ["NOUN", "VERB"]
    tsv = write(tmp_path, "train.tsv", "id\tsentence\tlabel\n1\tA fine, quiet film.\tpos\n\n2\tDull.\tneg\n")
    texts = ["A fine, quiet film.", "Dull."]
    assert read_tsv(tsv, text_column=1, label_column=2, header=True) == (texts, ["pos", "neg"])
    assert read_tsv(tsv, text_column=1, label_column=-1)[1] == ["label", "pos", "neg"]
    assert read_tsv(tsv, text_column=-2, label_column=0, header=True) == (texts, ["1", "2"])


def test_existing_readers_keep_latin1_fallback_and_take_an_encoding(tmp_path):
    latin1 = write(tmp_path, "esp.txt", "Pe\u00f1a B-PER\nLe\u00f3n B-LOC\n", encoding="latin-1")
    assert read_columns(latin1) == [(["Pe\u00f1a", "Le\u00f3n"], ["B-PER", "B-LOC"])]
    assert read_columns(latin1, encoding="latin-1") == read_columns(latin1)
    assert read_lines(latin1) == ["Pe\u00f1a B-PER", "Le\u00f3n B-LOC"]
    with pytest.raises(DataFormatError, match=r"esp\.txt:1: "):
        read_columns(latin1, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"esp\.txt:1: "):
        read_polarity(latin1, latin1, encoding="utf-8")
    assert read_polarity(latin1, latin1)[1] == [1, 1, 0, 0]


def expect_error(call, path, line, message):
    """Runs `call`: a DataFormatError whose str is `path:line: ...message...`."""
    with pytest.raises(DataFormatError) as caught:
        call()
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.path, error.line) == (str(path), line)
    assert str(error).startswith(f"{path}:{line}: "), str(error)
    assert message in error.message, error.message
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.line, again.path) == (str(error), line, str(path))


def test_wrong_column_counts_name_the_line(tmp_path):
    short = write(tmp_path, "short.conll", "EU NNP B-ORG\nrejects VBZ O\n\nPeter B-PER\n")
    expect_error(lambda: read_conll(short), short, 4, "expected 3 columns, found 2")
    expect_error(lambda: read_columns(short, tag_column=2), short, 4, "at least 3 columns")
    wide = write(tmp_path, "wide.conll", "EU NNP B-ORG\nrejects VBZ O extra\n")
    expect_error(lambda: read_conll(wide), wide, 2, "expected 3 columns, found 4")
    too_few = write(tmp_path, "two.conll", "\n\nEU B-ORG\n")
    expect_error(lambda: read_conll(too_few, COLUMNS | {"chunk": 2}), too_few, 3, "expected at least 3 columns")
    tsv = write(tmp_path, "train.tsv", "good\tpos\nbad\n")
    expect_error(lambda: read_tsv(tsv), tsv, 2, "expected 2 columns, found 1")
    one = write(tmp_path, "one.tsv", "only\n")
    expect_error(lambda: read_tsv(one), one, 1, "expected at least 2 columns, found 1")


def test_empty_files_name_the_last_line(tmp_path):
    empty = write(tmp_path, "empty.conll", "")
    expect_error(lambda: read_conll(empty), empty, 1, "no sentence")
    blank = write(tmp_path, "blank.conll", "-DOCSTART- O\n\n\n")
    expect_error(lambda: read_conll(blank), blank, 3, "no sentence")
    comments = write(tmp_path, "c.conllu", "# only a comment\n\n")
    expect_error(lambda: read_conllu_column(comments), comments, 2, "no sentence")
    expect_error(lambda: read_tagged_lines(empty), empty, 1, "no sentence")
    header_only = write(tmp_path, "h.tsv", "text\tlabel\n")
    expect_error(lambda: read_tsv(header_only, header=True), header_only, 1, "no sentence")
    assert read_columns(empty) == [] and read_conllu(empty) == []  # the older readers: no sentence, no error


def test_mismatched_tokens_and_tags_name_the_line(tmp_path):
    path = write(tmp_path, "train.tagged", "Dogs bark\tNOUN VERB\nThe cat sat\tDET NOUN\n")
    expect_error(lambda: read_tagged_lines(path), path, 2, "3 tokens but 2 tags")
    no_tags = write(tmp_path, "no_tags.tagged", "Dogs bark\tNOUN VERB\n\nDogs bark\n")
    expect_error(lambda: read_tagged_lines(no_tags), no_tags, 3, "found 1 parts")
    bad_tag = write(tmp_path, "bad.conll", "EU B-ORG\nrejects O\n\nPeter S-PER\n")
    expect_error(lambda: read_conll(bad_tag, scheme="iob2"), bad_tag, 4, "tag 'S-PER' does not fit the IOB2 scheme")


def test_undecodable_bytes_name_the_first_bad_line(tmp_path):
    data = "EU B-ORG\nrejects O\n\nPe\u00f1a B-PER\n".encode("latin-1")
    path = write(tmp_path, "latin1.conll", data)
    expect_error(lambda: read_conll(path), path, 4, "not valid utf-8")
    assert read_conll(path, encoding="latin-1")[1] == {"tokens": ["Pe\u00f1a"], "tags": ["B-PER"]}
    conllu = write(tmp_path, "x.conllu", CONLLU.encode("utf-8") + b"\n3\tna\xefve\t_\t_\t_\t_\t_\t_\t_\t_\n")
    expect_error(lambda: read_conllu_column(conllu), conllu, 12, "not valid utf-8")
    expect_error(lambda: read_conllu(conllu, encoding="utf-8"), conllu, 12, "not valid utf-8")
    tsv = write(tmp_path, "x.tsv", b"fine\tpos\n\nna\xefve\tneg\n")
    expect_error(lambda: read_tsv(tsv), tsv, 3, "not valid utf-8")
    tagged = write(tmp_path, "x.tagged", b"\xff\tX\n")
    expect_error(lambda: read_tagged_lines(tagged), tagged, 1, "not valid utf-8")


def test_conllu_lines_without_10_fields_name_the_line(tmp_path):
    nine = CONLLU.replace("3\tchat\tchat\tNOUN\tNC\tGender=Masc|Number=Sing\t0\troot\t_\tSpaceAfter=No",
                          "3\tchat\tchat\tNOUN\tNC\tGender=Masc|Number=Sing\t0\troot\t_")
    path = write(tmp_path, "nine.conllu", nine)
    expect_error(lambda: read_conllu_column(path), path, 5, "expected 10 tab-separated fields, found 9")
    expect_error(lambda: read_conllu(path), path, 5, "10 tab-separated columns, found 9")
    eleven = write(tmp_path, "eleven.conllu", CONLLU.replace("2:conj\t_\n", "2:conj\t_\textra\n"))
    expect_error(lambda: read_conllu_column(eleven), eleven, 10, "found 11")
    bad_id = write(tmp_path, "id.conllu", "a\tb\tc\tNOUN\tNN\t_\t0\troot\t_\t_\n")
    expect_error(lambda: read_conllu_column(bad_id), bad_id, 1, "invalid word ID 'a'")


def test_line_numbers_ignore_unicode_line_separators():
    # U+2028 and U+0085 inside a token are part of it, not line breaks.
    # So is a no-break space: only spaces and tabs separate columns.
    text = "a\u2028b B-X\nc\x85d O\n\n1\u00a0000 O\n"
    assert [s["tokens"] for s in parse_conll(text)] == [["a\u2028b", "c\x85d"], ["1\u00a0000"]]
    with pytest.raises(DataFormatError, match=r"^f:5: expected 2 columns, found 3"):
        parse_conll(text + "x y z\n", source="f")
    assert readers.split_lines("a\r\nb\n") == ["a", "b"]
