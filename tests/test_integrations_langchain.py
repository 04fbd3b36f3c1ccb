"""LangChain: CCEChatMessageHistory with the real langchain-core (and langgraph) packages.

The chat model is langchain-core's own fake chat model (no paid LLM API exists here); everything
else is real: a DuckDB data folder, the hash embedder, RunnableWithMessageHistory, a LangGraph
graph with its in-memory checkpointer.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from cce_duck import Engine, ValidationError
from cce_duck.integrations.langchain import CCEChatMessageHistory
from cce_duck.text import estimate_tokens

DEPRECATED_HISTORY = "ignore::langchain_core._api.deprecation.LangChainDeprecationWarning"


def sample() -> list[dict[str, Any]]:
    data = json.loads(resources.files("cce_duck.data").joinpath("sample_conversation.json").read_text())
    return list(data["messages"])


def _text(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


@pytest.fixture
def history(file_engine: Engine) -> CCEChatMessageHistory:
    h = CCEChatMessageHistory("lighthouse", engine=file_engine, max_tokens=400)
    file_engine.ingest("lighthouse", sample()[:36])
    return h


def test_messages_are_the_capped_context_for_the_latest_user_message(
        history: CCEChatMessageHistory, file_engine: Engine) -> None:
    history.add_user_message("What freezer alert threshold did we settle on?")
    msgs = history.messages
    assert isinstance(msgs[0], SystemMessage)
    assert "-16 °C" in str(msgs[0].content)  # the older topic, quoted verbatim
    assert msgs[-1] == HumanMessage(content="What freezer alert threshold did we settle on?")
    assert sum(estimate_tokens(str(m.content)) + 4 for m in msgs) <= 400
    assert len(msgs) < len(history.all_messages()) == 37
    # the notes are the engine's own choice for that question
    payload = file_engine.context("lighthouse", "What freezer alert threshold did we settle on?",
                                  max_tokens=400)
    assert str(msgs[0].content) == payload.memory


def test_search_add_and_roles_round_trip(history: CCEChatMessageHistory) -> None:
    hits = history.search("Twilio SMS rate limit", k=3)
    assert hits.height == 3
    assert "Twilio" in " ".join(hits["content"].to_list())
    history.add_messages([SystemMessage(content="Be brief."),
                          AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": "x"},
                                                             "id": "c1"}]),
                          ToolMessage(content="42 sensors", tool_call_id="c1"),
                          HumanMessage(content="Thanks.", name="Priya")])
    tail = history.all_messages()[-4:]
    assert isinstance(tail[0], SystemMessage)
    assert tail[1] == AIMessage(content='[tool call] lookup({"q": "x"})')
    assert tail[2].type == "chat"
    assert tail[2].content == "42 sensors"
    assert tail[3] == HumanMessage(content="Thanks.", name="Priya")


def test_bad_messages_store_nothing(history: CCEChatMessageHistory) -> None:
    before = history.all_messages()
    with pytest.raises(ValidationError):
        history.add_messages([HumanMessage(content="fine"), HumanMessage(content="   ")])
    assert history.all_messages() == before
    with pytest.raises(ValidationError):
        CCEChatMessageHistory("../etc", engine=history.engine)
    with pytest.raises(ValidationError):
        CCEChatMessageHistory("s", engine=history.engine, max_tokens=0)


def test_new_session_is_empty(file_engine: Engine) -> None:
    assert CCEChatMessageHistory("nobody", engine=file_engine).messages == []


@pytest.mark.filterwarnings(DEPRECATED_HISTORY)
def test_runnable_with_message_history_runs_a_chain(file_engine: Engine) -> None:
    file_engine.ingest("chat-1", sample()[:36])
    seen: list[list[BaseMessage]] = []

    def capture(prompt_value: Any) -> Any:
        seen.append(prompt_value.to_messages())
        return prompt_value

    model = FakeListChatModel(responses=["The freezer alert is at -16 °C.", "You're welcome."])
    prompt = ChatPromptTemplate.from_messages([("system", "You help the Lighthouse team."),
                                               MessagesPlaceholder("history"), ("human", "{question}")])
    chain = RunnableWithMessageHistory(
        prompt | RunnableLambda(capture) | model,
        lambda sid: CCEChatMessageHistory(sid, engine=file_engine, max_tokens=350),
        input_messages_key="question", history_messages_key="history")
    cfg = {"configurable": {"session_id": "chat-1"}}
    out = chain.invoke({"question": "What is the freezer alert threshold?"}, config=cfg)
    assert out.content == "The freezer alert is at -16 °C."
    full = file_engine.turns("chat-1")
    assert full.height == 38  # the question and the answer were stored
    assert full["content"].to_list()[-2:] == ["What is the freezer alert threshold?",
                                             "The freezer alert is at -16 °C."]
    # the second call's memory is matched against the latest stored user message (the question)
    chain.invoke({"question": "Thanks!"}, config=cfg)
    second = seen[1]
    assert isinstance(second[1], SystemMessage)
    assert "-16 °C" in str(second[1].content)
    assert second[-1] == HumanMessage(content="Thanks!")
    sent = sum(estimate_tokens(str(m.content)) + 4 for m in second[1:-1])
    assert sent <= 350
    assert sent < sum(estimate_tokens(c) + 4 for c in file_engine.turns("chat-1")["content"]) / 2


def test_langgraph_node_with_checkpointer(tmp_path: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    eng = Engine(data_dir=tmp_path / "lg", embedder="hash")
    try:
        eng.ingest("thread-7", sample()[:36])
        model = FakeListChatModel(responses=["In Lisbon, on March 14."])
        received: list[list[BaseMessage]] = []

        def respond(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            history = CCEChatMessageHistory(config["configurable"]["thread_id"], engine=eng,
                                            max_tokens=300)
            history.add_messages([state["messages"][-1]])  # store the question first
            context = history.messages                     # then read memory matched to it
            received.append(context)
            answer = model.invoke(context)
            history.add_messages([answer])
            return {"messages": [answer]}

        graph = StateGraph(MessagesState)
        graph.add_node("respond", respond)
        graph.add_edge(START, "respond")
        graph.add_edge("respond", END)
        app = graph.compile(checkpointer=InMemorySaver())
        cfg = {"configurable": {"thread_id": "thread-7"}}
        question = HumanMessage(content="Where is the meetup talk I am preparing?")
        result = app.invoke({"messages": [question]}, cfg)
        assert result["messages"][-1].content == "In Lisbon, on March 14."
        assert "PyData meetup in Lisbon" in _text(received[0])
        assert eng.turns("thread-7").height == 38
        # LangGraph's own persistence keeps the thread's state beside cce_duck's memory
        assert len(app.get_state(cfg).values["messages"]) == 2
    finally:
        eng.close()


def test_shared_engine_per_data_folder(tmp_path: Path) -> None:
    a = CCEChatMessageHistory("s1", data_dir=tmp_path / "shared", embedder="hash")
    b = CCEChatMessageHistory("s2", data_dir=tmp_path / "shared", embedder="hash")
    assert a.engine is b.engine
    a.add_user_message("Hello from s1 about the garden.")
    assert b.messages == []
    assert [m.content for m in a.messages] == ["Hello from s1 about the garden."]
    a.engine.close()


def test_clear_forgets_the_session_only(history: CCEChatMessageHistory, file_engine: Engine) -> None:
    file_engine.add_message("other", "user", "Keep me: the other session.")
    file_engine.pin("lighthouse", "A pin of the cleared session.")
    history.clear()
    assert history.all_messages() == []
    assert history.messages == []
    assert file_engine.sessions()["session_id"].to_list() == ["other"]  # deleted, pins and all
    assert file_engine.turns("other").height == 1
    history.add_user_message("Starting again after the clear.")
    assert [m.content for m in history.all_messages()] == ["Starting again after the clear."]
    assert file_engine.turns("lighthouse")["turn_no"].to_list() == [0]  # a new session
    assert file_engine.pins("lighthouse").is_empty()
    CCEChatMessageHistory("never-used", engine=file_engine).clear()  # nothing to do, no error
