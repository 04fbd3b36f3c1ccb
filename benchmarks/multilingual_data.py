"""The multilingual benchmark set: hand-written for this project (not taken from any dataset).

Five conversations in each of Spanish, Hindi and Chinese, twelve turns each (user and assistant
alternating), every one on its own day and topic. Each conversation has four questions in its
own language and one cross-lingual question asked in English, each with the turn that answers
it (index within the conversation) and a short ``fact`` string copied from that turn, so a
reader (and a test) can check that the turn really holds the answer.

A language's five conversations are ingested as one session (60 turns), so retrieval has to
pick the right turn among all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CONVERSATIONS", "LANGUAGES", "Conversation", "Question"]

LANGUAGES = ("spanish", "hindi", "chinese")


@dataclass(frozen=True)
class Question:
    """A question, the index of the turn that answers it, and a fact string of that turn."""

    text: str
    turn: int
    fact: str


@dataclass(frozen=True)
class Conversation:
    """Twelve turns (user first) of one language and topic, with its questions."""

    id: str
    language: str
    turns: list[str]
    questions: list[Question] = field(default_factory=list)
    cross: list[Question] = field(default_factory=list)


_ES = [
    Conversation(
        "es-1", "spanish",
        [
            # 0
            "Hola, te cuento una novedad: mi hermana Lucía se muda a Valencia el mes que viene.",
            # 1
            "¡Qué cambio tan grande! ¿Se va por trabajo o por otra razón?",
            # 2
            "Por trabajo. La han contratado como arquitecta en un estudio pequeño cerca del puerto.",
            # 3
            "Suena muy bien. ¿Ya tiene dónde vivir en Valencia?",
            # 4
            "Sí, alquiló un piso de dos habitaciones en el barrio de Ruzafa por 850 euros al mes.",
            # 5
            "Ruzafa es un barrio animado, con muchos cafés y mercados. Le va a gustar.",
            # 6
            "Lo malo es que su novio Andrés se queda en Sevilla hasta terminar el máster.",
            # 7
            "Una relación a distancia durante un tiempo puede funcionar si planean visitas.",
            # 8
            "Han quedado en verse cada dos fines de semana; el tren AVE tarda unas cuatro horas.",
            # 9
            "Es un buen plan. ¿Tú piensas ir a ayudarla con la mudanza?",
            # 10
            "Sí, voy a conducir la furgoneta con sus muebles el sábado 14 de octubre.",
            # 11
            "Perfecto, acuérdate de revisar los neumáticos antes de un viaje tan largo.",
        ],
        [
            Question("¿En qué trabaja Lucía en Valencia?", 2, "arquitecta"),
            Question("¿Cuánto paga Lucía de alquiler por el piso?", 4, "850 euros"),
            Question("¿Dónde se queda Andrés mientras termina el máster?", 6, "Sevilla"),
            Question("¿Qué día voy a llevar los muebles de mi hermana en la furgoneta?", 10,
                     "sábado 14 de octubre"),
        ],
        [Question("Which neighbourhood of Valencia did Lucía rent a flat in?", 4, "Ruzafa")],
    ),
    Conversation(
        "es-2", "spanish",
        [
            # 0
            "Estoy organizando un viaje a Perú con mi amigo Javier para el próximo verano.",
            # 1
            "¡Qué ilusión! ¿Cuántos días tenéis pensado estar allí?",
            # 2
            "Tres semanas. Volamos de Madrid a Lima el 3 de julio con Iberia.",
            # 3
            "Tres semanas dan para ver bastante. ¿Qué lugares queréis visitar?",
            # 4
            "Lo principal es Machu Picchu; queremos hacer el Camino Inca de cuatro días.",
            # 5
            "Para el Camino Inca hay que reservar el permiso con meses de antelación.",
            # 6
            "Ya lo reservamos con la agencia Andean Trails, nos costó 650 dólares por persona.",
            # 7
            "Muy bien. Recuerda que Cusco está a 3400 metros y conviene aclimatarse.",
            # 8
            "Por eso pasaremos dos días tranquilos en Cusco antes de empezar a caminar.",
            # 9
            "Buena idea. ¿Y después del camino qué haréis?",
            # 10
            "Javier quiere ver el lago Titicaca y yo quiero probar el ceviche en Lima.",
            # 11
            "Las dos cosas valen la pena; en Lima el ceviche se come sobre todo al mediodía.",
        ],
        [
            Question("¿Con qué aerolínea volamos a Lima?", 2, "Iberia"),
            Question("¿Cuánto costó el permiso del Camino Inca?", 6, "650 dólares"),
            Question("¿Cuántos días pasaremos en Cusco antes de caminar?", 8, "dos días"),
            Question("¿Qué lago quiere ver Javier?", 10, "Titicaca"),
        ],
        [Question("Which agency booked the Inca Trail permit?", 6, "Andean Trails")],
    ),
    Conversation(
        "es-3", "spanish",
        [
            # 0
            "Quiero preparar la paella de mi abuela Carmen para la comida del domingo.",
            # 1
            "¡Qué buen plan! ¿Recuerdas qué ingredientes usaba ella?",
            # 2
            "Usaba pollo, conejo, judías verdes y garrofó, nunca marisco.",
            # 3
            "Esa es la paella valenciana tradicional. ¿Qué arroz vas a usar?",
            # 4
            "Arroz bomba, porque absorbe mucho caldo sin pasarse.",
            # 5
            "El bomba es ideal. ¿Para cuántas personas cocinas?",
            # 6
            "Somos ocho, y mi cuñado Pablo es alérgico a los frutos secos.",
            # 7
            "Entonces evita el alioli con almendra y revisa las etiquetas del caldo.",
            # 8
            "Mi abuela siempre añadía una ramita de romero al final, fuera del fuego.",
            # 9
            "Ese detalle da un aroma precioso. ¿Tienes paellera lo bastante grande?",
            # 10
            "Tengo una paellera de 50 centímetros que me regaló mi madre por Navidad.",
            # 11
            "Con 50 centímetros llegas bien para ocho personas. ¡Que salga muy rica!",
        ],
        [
            Question("¿Qué tipo de arroz voy a usar para la paella?", 4, "Arroz bomba"),
            Question("¿Quién es alérgico a los frutos secos?", 6, "Pablo"),
            Question("¿Qué hierba añadía la abuela al final?", 8, "romero"),
            Question("¿De qué tamaño es la paellera?", 10, "50 centímetros"),
        ],
        [Question("What meats did grandmother Carmen put in her paella?", 2, "pollo, conejo")],
    ),
    Conversation(
        "es-4", "spanish",
        [
            # 0
            "Me he apuntado al medio maratón de Madrid, que es el 28 de abril.",
            # 1
            "¡Enhorabuena! ¿Cuánto tiempo llevas entrenando?",
            # 2
            "Empecé en enero; ahora corro cuatro días por semana con el club Corredores del Retiro.",
            # 3
            "Un club ayuda mucho a mantener la constancia. ¿Tienes un objetivo de tiempo?",
            # 4
            "Quiero bajar de una hora y cuarenta y cinco minutos.",
            # 5
            "Es un objetivo realista si haces series y una tirada larga cada semana.",
            # 6
            "El problema es que me duele la rodilla derecha desde la última tirada de 18 kilómetros.",
            # 7
            "No lo ignores; conviene que te vea un fisioterapeuta pronto.",
            # 8
            "Tengo cita el jueves con Marta Ruiz, la fisioterapeuta del club.",
            # 9
            "Bien. Mientras tanto, reduce el volumen y evita las cuestas.",
            # 10
            "Ella también me recomendó cambiar las zapatillas, ya tienen más de 900 kilómetros.",
            # 11
            "Las zapatillas gastadas suelen causar molestias; cámbialas antes de la carrera.",
        ],
        [
            Question("¿Cuándo es el medio maratón de Madrid?", 0, "28 de abril"),
            Question("¿Qué tiempo quiero conseguir en la carrera?", 4, "una hora y cuarenta y cinco"),
            Question("¿Qué me duele desde la última tirada larga?", 6, "rodilla derecha"),
            Question("¿Cuántos kilómetros tienen mis zapatillas?", 10, "900 kilómetros"),
        ],
        [Question("Who is the physiotherapist I have an appointment with?", 8, "Marta Ruiz")],
    ),
    Conversation(
        "es-5", "spanish",
        [
            # 0
            "Esta semana ha sido un lío en casa, necesito ordenar las tareas de la familia.",
            # 1
            "Claro, vamos por partes. ¿Qué es lo más urgente?",
            # 2
            "Mi hija Sofía empieza las clases de piano los martes a las cinco con la profesora Elena.",
            # 3
            "Anotado. ¿Necesita comprar algo para las clases?",
            # 4
            "Sí, un teclado de 61 teclas; he visto uno de segunda mano por 120 euros.",
            # 5
            "Para empezar es suficiente. ¿Qué más tienes pendiente?",
            # 6
            "Hay que llevar a nuestro perro Toby al veterinario para la vacuna de la rabia.",
            # 7
            "¿Ya tienes cita en la clínica?",
            # 8
            "Sí, el viernes a las diez en la clínica Patas Felices.",
            # 9
            "Perfecto. ¿Algo más?",
            # 10
            "El coche hace un ruido raro al frenar; el taller de Manolo me lo mira el lunes.",
            # 11
            "Bien pensado, con los frenos no conviene esperar.",
        ],
        [
            Question("¿Qué día tiene Sofía clase de piano?", 2, "martes a las cinco"),
            Question("¿Cuánto cuesta el teclado de segunda mano?", 4, "120 euros"),
            Question("¿Para qué vacuna llevamos a Toby al veterinario?", 6, "rabia"),
            Question("¿Qué le pasa al coche?", 10, "ruido raro al frenar"),
        ],
        [Question("What is the name of the vet clinic?", 8, "Patas Felices")],
    ),
]

_HI = [
    Conversation(
        "hi-1", "hindi",
        [
            # 0
            "मेरे चचेरे भाई रोहित की शादी अगले महीने जयपुर में है।",
            # 1
            "बधाई हो! शादी की तारीख क्या तय हुई है?",
            # 2
            "शादी 12 दिसंबर को है और संगीत उससे एक दिन पहले होगा।",
            # 3
            "बहुत बढ़िया। क्या आप वहाँ ट्रेन से जा रहे हैं?",
            # 4
            "हाँ, हमने दिल्ली से जयपुर के लिए शताब्दी एक्सप्रेस की टिकटें बुक कर ली हैं।",
            # 5
            "शताब्दी आरामदायक है। आप कपड़ों की तैयारी कैसे कर रहे हैं?",
            # 6
            "दुल्हन प्रिया ने कहा है कि मेहंदी में सबको पीले रंग के कपड़े पहनने हैं।",
            # 7
            "पीला रंग मेहंदी के लिए बहुत सुंदर लगता है।",
            # 8
            "मुझे अपने लिए एक शेरवानी सिलवानी है, दर्जी ने आठ हज़ार रुपये बताए हैं।",
            # 9
            "ठीक है, सिलाई के लिए कम से कम दो हफ्ते का समय रखिए।",
            # 10
            "उपहार में हम दोनों को चाँदी का डिनर सेट देने वाले हैं।",
            # 11
            "यह एक यादगार उपहार रहेगा।",
        ],
        [
            Question("रोहित की शादी किस तारीख को है?", 2, "12 दिसंबर"),
            Question("हम जयपुर किस ट्रेन से जा रहे हैं?", 4, "शताब्दी एक्सप्रेस"),
            Question("मेहंदी में किस रंग के कपड़े पहनने हैं?", 6, "पीले रंग"),
            Question("शेरवानी की सिलाई कितने की पड़ेगी?", 8, "आठ हज़ार रुपये"),
        ],
        [Question("What wedding gift are we giving the couple?", 10, "चाँदी का डिनर सेट")],
    ),
    Conversation(
        "hi-2", "hindi",
        [
            # 0
            "अच्छी खबर है, मुझे बेंगलुरु की एक सॉफ्टवेयर कंपनी में नौकरी मिल गई है।",
            # 1
            "वाह, बहुत बधाई! कंपनी का नाम क्या है?",
            # 2
            "कंपनी का नाम नीलगिरी टेक है और मैं वहाँ डेटा इंजीनियर बनूँगी।",
            # 3
            "शानदार। आप काम कब से शुरू करेंगी?",
            # 4
            "मेरा पहला दिन 1 मार्च को है, मेरी मैनेजर का नाम कविता मेनन है।",
            # 5
            "नई शुरुआत के लिए शुभकामनाएँ। रहने की क्या व्यवस्था है?",
            # 6
            "मैंने इंदिरानगर में एक कमरा किराए पर लिया है, किराया अठारह हज़ार रुपये महीना है।",
            # 7
            "इंदिरानगर से दफ्तर कितना दूर है?",
            # 8
            "दफ्तर व्हाइटफील्ड में है, मेट्रो से लगभग चालीस मिनट लगते हैं।",
            # 9
            "मेट्रो से जाना ट्रैफिक से बेहतर रहेगा।",
            # 10
            "हफ्ते में दो दिन, मंगलवार और शुक्रवार, घर से काम करने की छूट है।",
            # 11
            "यह सुविधा बहुत काम की है।",
        ],
        [
            Question("नई कंपनी में मेरा पद क्या होगा?", 2, "डेटा इंजीनियर"),
            Question("मेरी मैनेजर कौन है?", 4, "कविता मेनन"),
            Question("इंदिरानगर वाले कमरे का किराया कितना है?", 6, "अठारह हज़ार"),
            Question("मैं किन दिनों घर से काम कर सकती हूँ?", 10, "मंगलवार और शुक्रवार"),
        ],
        [Question("How long does the metro ride to the office take?", 8, "चालीस मिनट")],
    ),
    Conversation(
        "hi-3", "hindi",
        [
            # 0
            "माँ की शुगर पिछले हफ्ते बहुत बढ़ गई थी, इसलिए हम डॉक्टर के पास गए।",
            # 1
            "आशा है अब वे ठीक हैं। डॉक्टर ने क्या कहा?",
            # 2
            "डॉक्टर शर्मा ने मेटफॉर्मिन की गोली सुबह और रात खाने के बाद लेने को कहा है।",
            # 3
            "दवा समय पर लेना सबसे ज़रूरी है।",
            # 4
            "खाली पेट शुगर 180 आई थी, डॉक्टर चाहते हैं कि यह 130 से नीचे रहे।",
            # 5
            "खाने में भी बदलाव करने होंगे।",
            # 6
            "हाँ, माँ ने चावल छोड़कर रागी की रोटी खानी शुरू कर दी है।",
            # 7
            "रागी अच्छा विकल्प है। व्यायाम का क्या?",
            # 8
            "वे रोज़ शाम को पार्क में आधा घंटा टहलती हैं।",
            # 9
            "बहुत अच्छा। अगली जाँच कब है?",
            # 10
            "अगली जाँच तीन महीने बाद है, तब एचबीए1सी टेस्ट भी होगा।",
            # 11
            "मैं आपको जाँच से एक हफ्ता पहले याद दिला दूँगा।",
        ],
        [
            Question("डॉक्टर ने माँ को कौन सी दवा दी है?", 2, "मेटफॉर्मिन"),
            Question("माँ की खाली पेट शुगर कितनी आई थी?", 4, "180"),
            Question("माँ चावल की जगह क्या खा रही हैं?", 6, "रागी की रोटी"),
            Question("माँ रोज़ कितनी देर टहलती हैं?", 8, "आधा घंटा"),
        ],
        [Question("Which test will be done at mother's next check-up?", 10, "एचबीए1सी")],
    ),
    Conversation(
        "hi-4", "hindi",
        [
            # 0
            "दिवाली की खरीदारी की सूची बनानी है, मदद करोगे?",
            # 1
            "ज़रूर। इस बार कुल बजट कितना रखा है?",
            # 2
            "पूरा बजट पच्चीस हज़ार रुपये है, उससे ज़्यादा नहीं।",
            # 3
            "ठीक है। सबसे पहले क्या खरीदना है?",
            # 4
            "पापा के लिए एक ऊनी शॉल और माँ के लिए सोने की बालियाँ।",
            # 5
            "बालियाँ बजट का बड़ा हिस्सा ले लेंगी।",
            # 6
            "बालियों के लिए मैंने करोल बाग के जौहरी गुप्ता जी से बात की है।",
            # 7
            "अच्छा, बच्चों के लिए क्या लेना है?",
            # 8
            "भतीजी अनन्या को रंग भरने की किताबें पसंद हैं और भतीजे को एक रिमोट वाली कार चाहिए।",
            # 9
            "बच्चे इन उपहारों से खुश होंगे।",
            # 10
            "घर सजाने के लिए मिट्टी के सौ दीये और एलईडी लाइटें भी लेनी हैं।",
            # 11
            "मिट्टी के दीये पर्यावरण के लिए भी अच्छे हैं।",
        ],
        [
            Question("दिवाली की खरीदारी का कुल बजट कितना है?", 2, "पच्चीस हज़ार"),
            Question("पापा के लिए क्या खरीदना है?", 4, "ऊनी शॉल"),
            Question("अनन्या को क्या पसंद है?", 8, "रंग भरने की किताबें"),
            Question("घर सजाने के लिए कितने दीये लेने हैं?", 10, "सौ दीये"),
        ],
        [Question("Which jeweller did I talk to about the earrings?", 6, "गुप्ता जी")],
    ),
    Conversation(
        "hi-5", "hindi",
        [
            # 0
            "मैंने गिटार सीखना शुरू किया है, बहुत मज़ा आ रहा है।",
            # 1
            "यह तो बढ़िया शौक है! आप किससे सीख रहे हैं?",
            # 2
            "मेरे गुरु अमित सर हैं, वे लाजपत नगर में संगीत अकादमी चलाते हैं।",
            # 3
            "कक्षाएँ हफ्ते में कितनी बार होती हैं?",
            # 4
            "कक्षा हर बुधवार और शनिवार शाम सात बजे होती है।",
            # 5
            "अभ्यास के लिए गिटार कौन सा लिया?",
            # 6
            "मैंने यामाहा का अकूस्टिक गिटार ग्यारह हज़ार रुपये में खरीदा है।",
            # 7
            "शुरुआत के लिए यामाहा अच्छा ब्रांड है।",
            # 8
            "अभी मैं जी, सी और डी कॉर्ड बजाना सीख रहा हूँ, उँगलियों में दर्द होता है।",
            # 9
            "शुरू में दर्द होना सामान्य है, धीरे-धीरे आदत हो जाएगी।",
            # 10
            "जून में मेरी ट्रिनिटी ग्रेड वन की परीक्षा है।",
            # 11
            "तब तक रोज़ बीस मिनट अभ्यास करना काफी रहेगा।",
        ],
        [
            Question("मेरे गिटार गुरु कौन हैं?", 2, "अमित सर"),
            Question("गिटार की कक्षा किन दिनों होती है?", 4, "बुधवार और शनिवार"),
            Question("गिटार कितने का खरीदा?", 6, "ग्यारह हज़ार"),
            Question("मैं अभी कौन से कॉर्ड सीख रहा हूँ?", 8, "जी, सी और डी"),
        ],
        [Question("Which guitar exam am I taking in June?", 10, "ट्रिनिटी ग्रेड वन")],
    ),
]

_ZH = [
    Conversation(
        "zh-1", "chinese",
        [
            # 0
            "我下个月要搬到上海了，公司把我调到了浦东的分部。",
            # 1
            "恭喜！找好住的地方了吗？",
            # 2
            "找好了，在徐汇区租了一套一室一厅，月租六千五百元。",
            # 3
            "徐汇区环境不错。离公司远吗？",
            # 4
            "坐地铁九号线大概四十五分钟，中间不用换乘。",
            # 5
            "还可以接受。你一个人住吗？",
            # 6
            "不是，我的大学同学小林和我合租，她在复旦读研究生。",
            # 7
            "有熟人一起住会方便很多。",
            # 8
            "房东要求押一付三，所以第一次要交两万六千元。",
            # 9
            "记得签合同前仔细看清退租条款。",
            # 10
            "搬家那天我打算请蚂蚁搬家公司，定在十一月五号。",
            # 11
            "好的，提前一周再确认一下时间。",
        ],
        [
            Question("我在上海哪个区租的房子？", 2, "徐汇区"),
            Question("坐地铁去公司要多长时间？", 4, "四十五分钟"),
            Question("和我合租的人是谁？", 6, "小林"),
            Question("第一次要交多少钱给房东？", 8, "两万六千元"),
        ],
        [Question("Which moving company will I hire, and on what date?", 10, "蚂蚁搬家")],
    ),
    Conversation(
        "zh-2", "chinese",
        [
            # 0
            "下周六是我爸爸的六十岁生日，我想给他办一个生日宴。",
            # 1
            "六十大寿很重要！打算请多少人？",
            # 2
            "大概二十个人，主要是亲戚和爸爸的老同事。",
            # 3
            "选好餐厅了吗？",
            # 4
            "订了老城区的福满楼，包间可以坐两桌。",
            # 5
            "福满楼的菜口碑很好。菜单定了吗？",
            # 6
            "一定要有爸爸最爱吃的红烧狮子头，还有长寿面。",
            # 7
            "寓意很好。礼物准备了什么？",
            # 8
            "我和妹妹一起给他买了一块浪琴手表。",
            # 9
            "很有纪念意义。蛋糕呢？",
            # 10
            "蛋糕在好利来订了，是八寸的水果奶油蛋糕。",
            # 11
            "听起来一切都安排好了，祝叔叔生日快乐！",
        ],
        [
            Question("爸爸的生日宴大概请多少人？", 2, "二十个人"),
            Question("生日宴订在哪家餐厅？", 4, "福满楼"),
            Question("爸爸最爱吃什么菜？", 6, "红烧狮子头"),
            Question("蛋糕是在哪里订的？", 10, "好利来"),
        ],
        [Question("What present did my sister and I buy for our father?", 8, "浪琴手表")],
    ),
    Conversation(
        "zh-3", "chinese",
        [
            # 0
            "我最近在学开车，报了城东的驾校。",
            # 1
            "学得怎么样？教练好吗？",
            # 2
            "教练姓王，很严格，但是讲得很清楚。",
            # 3
            "严格的教练往往教得好。现在考到哪一科了？",
            # 4
            "科目一已经过了，考了九十六分。",
            # 5
            "很不错！科目二呢？",
            # 6
            "科目二第一次没过，倒车入库压线了。",
            # 7
            "别灰心，倒车入库多练几次就好了。",
            # 8
            "我每天早上六点去练车一个小时，趁人少。",
            # 9
            "这个习惯很好。下次考试是什么时候？",
            # 10
            "科目二补考定在三月十八号上午。",
            # 11
            "加油，考前一天好好休息。",
        ],
        [
            Question("我的驾校教练姓什么？", 2, "姓王"),
            Question("科目一考了多少分？", 4, "九十六分"),
            Question("科目二为什么没过？", 6, "倒车入库压线"),
            Question("科目二补考是哪天？", 10, "三月十八号"),
        ],
        [Question("At what time do I go to practise driving every morning?", 8, "六点")],
    ),
    Conversation(
        "zh-4", "chinese",
        [
            # 0
            "我上周从救助站领养了一只小猫。",
            # 1
            "太好了！是什么样的猫？",
            # 2
            "是一只橘色的公猫，大概四个月大，我给它取名叫芒果。",
            # 3
            "芒果这个名字好可爱。它适应新家了吗？",
            # 4
            "第一天躲在沙发底下不出来，第三天就开始到处跑了。",
            # 5
            "猫咪需要几天适应，很正常。带它去打疫苗了吗？",
            # 6
            "约了周四去宠物医院打第二针猫三联，医生姓陈。",
            # 7
            "记得也做一下驱虫。平时给它吃什么？",
            # 8
            "吃皇家的幼猫粮，每天三顿，每顿二十克。",
            # 9
            "幼猫少食多餐是对的。",
            # 10
            "我还买了一个猫爬架，花了三百八十元。",
            # 11
            "有了猫爬架，它就不太会抓沙发了。",
        ],
        [
            Question("小猫叫什么名字？", 2, "芒果"),
            Question("小猫第一天躲在哪里？", 4, "沙发底下"),
            Question("小猫每顿吃多少猫粮？", 8, "二十克"),
            Question("猫爬架花了多少钱？", 10, "三百八十元"),
        ],
        [Question("Which vaccine is the kitten getting on Thursday?", 6, "猫三联")],
    ),
    Conversation(
        "zh-5", "chinese",
        [
            # 0
            "国庆节我打算和男朋友去云南旅游。",
            # 1
            "云南很美！打算去哪些地方？",
            # 2
            "先去大理住三天，然后去丽江，最后到香格里拉。",
            # 3
            "路线很经典。机票买好了吗？",
            # 4
            "买好了，十月一号早上从北京飞昆明，东航的航班。",
            # 5
            "从昆明到大理可以坐高铁，两个小时左右。",
            # 6
            "在大理我们订了洱海边的一家民宿，叫云上花开。",
            # 7
            "洱海边看日出很漂亮。",
            # 8
            "男朋友有点担心香格里拉海拔高，会有高原反应。",
            # 9
            "可以提前准备红景天，到了以后少运动多休息。",
            # 10
            "这次旅行的总预算是一万二千元，两个人一起。",
            # 11
            "这个预算住民宿和吃当地菜足够了。",
        ],
        [
            Question("我们在大理住几天？", 2, "大理住三天"),
            Question("去昆明坐的是哪家航空公司的航班？", 4, "东航"),
            Question("在大理订的民宿叫什么名字？", 6, "云上花开"),
            Question("这次云南旅行的总预算是多少？", 10, "一万二千元"),
        ],
        [Question("What is my boyfriend worried about in Shangri-La?", 8, "高原反应")],
    ),
]

CONVERSATIONS: list[Conversation] = [*_ES, *_HI, *_ZH]
