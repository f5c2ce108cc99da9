"""keras_birnn.data.readers: the CoNLL-U reader on real EWT lines, the CoNLL column
reader on hand-written files, the held-out split, the polarity reader."""

import os
import re

import pytest

from keras_birnn.data.readers import (
    parse_columns,
    parse_conllu,
    read_columns,
    read_conllu,
    read_lines,
    read_polarity,
    split_held_out,
)
from helpers import CONLL2000, CONLL2002, EWT, POLARITY


# Two sentences verbatim from UD English EWT r2.15 train (CC BY-SA 4.0): the
# first has a multiword-token range (1-2), the second an empty node (8.1).
EWT_LINES = (
    "# sent_id = weblog-blogspot.com_alaindewitt_20040929103700_ENG_20040929_103700-0075\n"
    "# text = That\u2019s fine.\n"
    "1-2\tThat\u2019s\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "1\tThat\tthat\tPRON\tDT\tNumber=Sing|PronType=Dem\t3\tnsubj\t3:nsubj\t_\n"
    "2\t\u2019s\tbe\tAUX\tVBZ\tMood=Ind|Number=Sing|Person=3|Tense=Pres|VerbForm=Fin\t3\tcop\t3:cop\t_\n"
    "3\tfine\tfine\tADJ\tJJ\tDegree=Pos\t0\troot\t0:root\tSpaceAfter=No\n"
    "4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t3:punct\t_\n"
    "\n"
    "# sent_id = weblog-blogspot.com_healingiraq_20040409053012_ENG_20040409_053012-0022\n"
    "# text = Over 300 Iraqis are reported dead and 500 wounded in Fallujah alone.\n"
    "1\tOver\tover\tADV\tRB\t_\t2\tadvmod\t2:advmod\t_\n"
    "2\t300\t300\tNUM\tCD\tNumForm=Digit|NumType=Card\t3\tnummod\t3:nummod\t_\n"
    "3\tIraqis\tIraqi\tPROPN\tNNPS\tNumber=Plur\t5\tnsubj:pass\t5:nsubj:pass|6:nsubj:xsubj|8:nsubj:pass\t_\n"
    "4\tare\tbe\tAUX\tVBP\tMood=Ind|Number=Plur|Person=3|Tense=Pres|VerbForm=Fin\t5\taux:pass\t5:aux:pass\t_\n"
    "5\treported\treport\tVERB\tVBN\tTense=Past|VerbForm=Part|Voice=Pass\t0\troot\t0:root\t_\n"
    "6\tdead\tdead\tADJ\tJJ\tDegree=Pos\t5\txcomp\t5:xcomp\t_\n"
    "7\tand\tand\tCCONJ\tCC\t_\t8\tcc\t8:cc|8.1:cc\t_\n"
    "8\t500\t500\tNUM\tCD\tNumForm=Digit|NumType=Card\t5\tconj\t5:conj:and|8.1:nsubj:pass|9:nsubj:xsubj\t_\n"
    "8.1\treported\treport\tVERB\tVBN\tTense=Past|VerbForm=Part|Voice=Pass\t_\t_\t5:conj:and\tCopyOf=5\n"
    "9\twounded\twounded\tADJ\tJJ\tDegree=Pos\t8\torphan\t8.1:xcomp\t_\n"
    "10\tin\tin\tADP\tIN\t_\t11\tcase\t11:case\t_\n"
    "11\tFallujah\tFallujah\tPROPN\tNNP\tNumber=Sing\t5\tobl\t5:obl:in\t_\n"
    "12\talone\talone\tADV\tRB\t_\t11\tadvmod\t11:advmod\tSpaceAfter=No\n"
    "13\t.\t.\tPUNCT\t.\t_\t5\tpunct\t5:punct\t_\n"
    "\n"
)

THATS_FINE = (
    ["That", "\u2019s", "fine", "."],
    ["PRON", "AUX", "ADJ", "PUNCT"],
    ["DT", "VBZ", "JJ", "."],
)
IRAQIS = (
    "Over 300 Iraqis are reported dead and 500 wounded in Fallujah alone .".split(),
    ["ADV", "NUM", "PROPN", "AUX", "VERB", "ADJ", "CCONJ", "NUM", "ADJ", "ADP", "PROPN", "ADV", "PUNCT"],
    ["RB", "CD", "NNPS", "VBP", "VBN", "JJ", "CC", "CD", "JJ", "IN", "NNP", "RB", "."],
)


def test_multiword_ranges_and_empty_nodes_are_skipped():
    sentences = parse_conllu(EWT_LINES)
    assert len(sentences) == 2
    # 1-2 "That's" is the surface form of words 1 and 2: only the words stay.
    assert sentences[0] == THATS_FINE
    # 8.1 "reported" is an empty node (no surface form): 13 words, not 14.
    assert sentences[1] == IRAQIS
    assert sentences[1][0].count("reported") == 1


def test_read_conllu_from_a_file_tolerates_crlf_bom_and_no_final_blank_line(tmp_path):
    path = tmp_path / "two.conllu"
    path.write_bytes(("\ufeff" + EWT_LINES.rstrip("\n")).replace("\n", "\r\n").encode("utf-8"))
    assert read_conllu(path) == [THATS_FINE, IRAQIS]
    assert read_conllu(str(path)) == [THATS_FINE, IRAQIS]


def test_several_blank_lines_and_comments_between_sentences():
    second = "# sent_id = weblog-blogspot.com_healingiraq"
    text = EWT_LINES.replace("\n\n" + second, "\n\n\n# newdoc\n" + second)
    assert parse_conllu(text) == [THATS_FINE, IRAQIS]
    assert parse_conllu("") == []
    assert parse_conllu("# only a comment\n\n") == []


def test_malformed_lines_name_the_file_and_line():
    broken = EWT_LINES.replace("3\tfine\tfine\tADJ\tJJ\tDegree=Pos\t0\troot\t0:root\tSpaceAfter=No", "3 fine ADJ")
    with pytest.raises(ValueError, match=r"x\.conllu:6: .*10 tab-separated columns"):
        parse_conllu(broken, source="x.conllu")
    with pytest.raises(ValueError, match="invalid word ID 'a'"):
        parse_conllu("a\tb\tc\tNOUN\tNN\t_\t0\troot\t_\t_\n")


@pytest.mark.skipif(not os.path.isdir(EWT), reason="shared data folder ../shared/data/ud_english_ewt absent")
@pytest.mark.parametrize("split, sentences, words", [("train", 12_544, 204_577), ("dev", 2_001, 25_147)])
def test_shared_ewt_files(split, sentences, words):
    path = os.path.join(EWT, f"en_ewt-ud-{split}.conllu")
    data = read_conllu(path)
    # The counts of shared/data/README.md, and an independent count of
    # word lines (integer IDs) straight from the file.
    assert len(data) == sentences
    assert sum(len(tokens) for tokens, _, _ in data) == words
    with open(path, encoding="utf-8") as f:
        assert len(re.findall(r"^\d+\t", f.read(), flags=re.M)) == words
    for tokens, upos, xpos in data:
        assert len(tokens) == len(upos) == len(xpos) > 0
    tags = {tag for _, upos, _ in data for tag in upos}
    assert tags <= {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
                    "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X"}
    if split == "train":
        assert THATS_FINE in data and IRAQIS in data


def test_read_polarity_from_files(tmp_path):
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("a fine film . \n\n  moving  \n", encoding="utf-8")
    neg.write_bytes("dull\nclich\xe9d plot\n".encode("latin-1"))  # not UTF-8: read as Latin-1
    texts, labels = read_polarity(pos, neg)
    assert texts == ["a fine film .", "moving", "dull", "clich\u00e9d plot"]
    assert labels == [1, 1, 0, 0]
    assert read_lines(neg) == ["dull", "clich\u00e9d plot"]


@pytest.mark.skipif(not os.path.isdir(POLARITY), reason="shared data folder ../shared/data/sentence_polarity absent")
def test_shared_polarity_files():
    texts, labels = read_polarity(os.path.join(POLARITY, "rt-polarity.pos"), os.path.join(POLARITY, "rt-polarity.neg"))
    assert len(texts) == 10_662 and sum(labels) == 5_331
    assert texts[0].startswith("the rock is destined to be the 21st century's new")


# --- CoNLL column files ----------------------------------------------------------------

# CoNLL-2000 layout, `word POS chunk`, written by hand.
CHUNK_LINES = (
    "He PRP B-NP\n"
    "reckons VBZ B-VP\n"
    "the DT B-NP\n"
    "deficit NN I-NP\n"
    "\n"
    "Rockwell NNP B-NP\n"
    "said VBD B-VP\n"
    ". . O\n"
)
# CoNLL-2002 original layout, `word tag`, with document breaks (as in the
# Dutch files) and several blank lines; Latin-1 characters.
NER_LINES = (
    "-DOCSTART- -DOCSTART-\n"
    "\n"
    "Sancho B-PER\n"
    "Pe\u00f1a I-PER\n"
    "vive O\n"
    "en O\n"
    "Le\u00f3n B-LOC\n"
    "\n"
    "\n"
    "-DOCSTART- -DOCSTART-\n"
    "La O\n"
    "EFE B-ORG\n"
)


def test_columns_three_and_two_columns_docstart_and_blank_lines():
    assert parse_columns(CHUNK_LINES) == [
        (["He", "reckons", "the", "deficit"], ["B-NP", "B-VP", "B-NP", "I-NP"]),
        (["Rockwell", "said", "."], ["B-NP", "B-VP", "O"]),
    ]
    # The POS column instead of the chunk column.
    assert parse_columns(CHUNK_LINES, tag_column=1)[1] == (["Rockwell", "said", "."], ["NNP", "VBD", "."])
    # -DOCSTART- lines are no tokens, and they break sentences (no blank line before "La").
    assert parse_columns(NER_LINES) == [
        (["Sancho", "Pe\u00f1a", "vive", "en", "Le\u00f3n"], ["B-PER", "I-PER", "O", "O", "B-LOC"]),
        (["La", "EFE"], ["O", "B-ORG"]),
    ]
    assert parse_columns("") == [] and parse_columns("-DOCSTART- O\n\n\n") == []
    assert parse_columns("a\tDT\tB-NP\nb  NN   I-NP\n") == [(["a", "b"], ["B-NP", "I-NP"])]  # tabs, runs of spaces


def test_read_columns_latin1_utf8_crlf_and_no_final_blank_line(tmp_path):
    expected = parse_columns(NER_LINES)
    latin1, utf8 = tmp_path / "esp.latin1", tmp_path / "esp.utf8"
    latin1.write_bytes(NER_LINES.replace("\n", "\r\n").encode("latin-1"))
    utf8.write_bytes(("\ufeff" + NER_LINES.rstrip("\n")).encode("utf-8"))
    assert read_columns(latin1) == expected  # not UTF-8: read as Latin-1
    assert read_columns(str(utf8)) == expected


def test_columns_malformed_lines_name_the_file_and_line():
    with pytest.raises(ValueError, match=r"x\.txt:2: .*at least 2 columns"):
        parse_columns("He B-NP\nreckons\n", source="x.txt")
    with pytest.raises(ValueError, match=r"<string>:1: .*at least 4 columns"):
        parse_columns("He PRP B-NP\n", tag_column=3)
    with pytest.raises(ValueError, match=r"at least 3 columns"):
        parse_columns("He B-NP\n", tag_column=-3)


def test_split_held_out_is_fixed_disjoint_and_keeps_the_order():
    items = list(range(100))
    kept, held = split_held_out(items, fraction=0.1, seed=0)
    assert len(held) == 10 and len(kept) == 90
    assert sorted(kept + held) == items and kept == sorted(kept) and held == sorted(held)
    assert split_held_out(items, 0.1, seed=0) == (kept, held)
    assert split_held_out(items, 0.1, seed=1)[1] != held
    # Python guarantees random.Random(seed).random() across versions, so the split is pinned.
    assert held == [25, 35, 40, 46, 52, 56, 70, 71, 75, 97]
    assert split_held_out(items, 0.0) == (items, []) and split_held_out([], 0.1) == ([], [])
    with pytest.raises(ValueError, match="fraction"):
        split_held_out(items, 1.5)


@pytest.mark.skipif(not os.path.isdir(CONLL2002), reason="shared data folder ../shared/data/conll2002_spanish absent")
@pytest.mark.parametrize("name, sentences, tokens", [("esp.train", 8_323, 264_715), ("esp.testa", 1_915, 52_923)])
def test_shared_conll2002_files(name, sentences, tokens):
    data = read_columns(os.path.join(CONLL2002, name))
    assert len(data) == sentences and sum(len(t) for t, _ in data) == tokens  # shared/data/README.md
    assert {tag for _, tags in data for tag in tags} == {
        "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"}
    if name == "esp.train":
        assert data[0][0][:4] == ["Melbourne", "(", "Australia", ")"] and data[0][1][:3] == ["B-LOC", "O", "B-LOC"]


@pytest.mark.skipif(not os.path.isdir(CONLL2000), reason="shared data folder ../shared/data/conll2000_chunking absent")
def test_shared_conll2000_file_and_its_held_out_split():
    data = read_columns(os.path.join(CONLL2000, "train.txt"))
    assert len(data) == 8_936 and sum(len(t) for t, _ in data) == 211_727
    assert data[0][0][:3] == ["Confidence", "in", "the"] and data[0][1][:3] == ["B-NP", "B-PP", "B-NP"]
    train, held = split_held_out(data, fraction=0.1, seed=0)
    assert len(held) == 894 and len(train) == 8_042
    assert held[0][0][:4] == ["In", "Tokyo", "on", "Monday"]  # sentence 35 of the file
    assert held[0] == data[35] and train[:35] == data[:35]
