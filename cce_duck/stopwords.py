"""Stop words beyond English, and question filler words per language.

Kept short on purpose: only function words that carry no topic. Words that are also English
content words (``son``, ``era``, ``sin``, ``con``, ``han``, ...) are left out, since one set
serves every language of a mixed-language memory. Forms are given as :func:`cce_duck.text`
normalises them (NFKC, case folded, Arabic lightly normalised, Russian yo as ie).
"""

from __future__ import annotations

__all__ = ["OTHER_STOPWORDS", "QUESTION_WORDS"]


def _words(text: str) -> list[str]:
    return text.split()


_SPANISH = _words("""
de la que el en los del se las por un para una su al lo como más pero sus le ya este sí porque
esta entre cuando muy sobre también me hasta hay donde quien desde todo nos durante todos uno
les ni contra otros ese eso esto mí antes algunos qué unos yo otro otras otra él tanto esa estos
mucho quienes nada muchos cual poco ella estar estas algunas algo nosotros mi mis tú te ti tu
tus ellas nosotras vosotros os mío mía míos mías es son fue eran está están estoy estás estaba
tengo tiene tienen tenía ha he has hemos había ser sido muy así aquí allí dónde cuándo cómo
cuál cuáles quién quiénes cuánto cuánta cuántos cuántas vez
""")
_SPANISH_ENGLISH_WORDS = {"son", "sin", "con", "era", "ante", "solo", "he", "has", "me", "hay", "todo", "uno"}

_RUSSIAN = _words("""
и в во не что он на я с со как а то все она так его но да ты к у же вы за бы по только ее мне
было вот от меня еще нет о из ему теперь когда даже ну вдруг ли если уже или ни быть был него
до вас нибудь опять уж вам ведь там потом себя ничего ей может они тут где есть надо ней для
мы тебя их чем была сам чтоб без будто чего раз тоже себе под будет ж тогда кто этот того
потому этого какой совсем ним здесь этом один почти мой тем чтобы нее сейчас были куда зачем
всех никогда можно при наконец два об другой хоть после над больше тот через эти нас про всего
них какая много разве три эту моя впрочем хорошо свою этой перед иногда лучше чуть том нельзя
такой им более всегда конечно всю между это мой моя мое мои
""")

_HINDI = _words("""
है हैं था थी थे हो होता होती होते हुआ हुई हुए के की का को में से पर ने भी और या तो ही कि जो
यह वह ये वे इस उस इन उन एक मैं मेरा मेरी मेरे मुझे हम हमारा हमारी हमारे तुम तुम्हारा आप आपका
आपकी आपके उसका उसकी उसके उनका उनकी उनके अपना अपनी अपने कर करना करते करता करती किया कुछ
नहीं लिए साथ बहुत अब जब तक वाला वाली वाले रहा रही रहे गया गई गए
""")

_ARABIC = _words("""
في من على الى إلى عن مع هذا هذه ذلك تلك التي الذي الذين هو هي هم انا أنا نحن انت أنت كان
كانت يكون قد لا ما لم لن ان أن إن او أو ثم كل بعض و ف ب ل عند بين حتى لكن اذا إذا
""")

_CJK_SINGLE = list("的了是在我你他她它们吗呢吧啊和与也都就不这那有个之")
_JAPANESE = _words("は が を に で と の も へ や か ね よ な です ます だ した する")

OTHER_STOPWORDS: frozenset[str] = frozenset(
    {w for w in _SPANISH if w not in _SPANISH_ENGLISH_WORDS}
    | set(_RUSSIAN) | set(_HINDI) | set(_ARABIC) | set(_CJK_SINGLE) | set(_JAPANESE)
)

#: Words (and CJK bigrams) that only ask, in questions: "what", "when", "tell me", "remember".
QUESTION_WORDS: frozenset[str] = frozenset(_words(
    """
    dijo dije dijiste mencionó mencioné recuerdas recuerda acuerdas sabes sabe hablamos dime
    cuéntame habló contó
    क्या कब कहाँ कहां कौन कौनसा किस किसने किसको किसे कैसे कितना कितने कितनी क्यों बताओ बताइए
    बताया याद कहा बोला
    что где когда кто как почему сколько какой какая какие помнишь расскажи сказал сказала
    ماذا متى اين أين من كيف لماذا كم هل قال
    什么 么时 时候 哪里 哪儿 哪个 哪些 多少 怎么 为什 么样 谁 吗 呢 记得 说过 提到
    なに 何 いつ どこ だれ 誰 どう
    """))
