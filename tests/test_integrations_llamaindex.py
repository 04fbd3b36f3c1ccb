"""LlamaIndex: CCEChatMemory with the real llama-index-core package.

The LLMs are llama-index-core's own mock LLMs that record what they were sent (no paid LLM API
exists here); the data folder, the engine, the chat engine and the agent workflow are real.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import (
    MockFunctionCallingLLMWithChatMemoryOfLastCall,
    MockLLMWithChatMemoryOfLastCall,
)

from cce_duck import Engine, ValidationError
from cce_duck.integrations.llamaindex import CCEChatMemory
from cce_duck.text import estimate_tokens


def sample() -> list[dict[str, Any]]:
    data = json.loads(resources.files("cce_duck.data").joinpath("sample_conversation.json").read_text())
    return list(data["messages"])


def _tokens(messages: list[ChatMessage]) -> int:
    return sum(estimate_tokens(m.content or "") + 4 for m in messages)


@pytest.fixture
def memory(file_engine: Engine) -> CCEChatMemory:
    file_engine.ingest("li", sample()[:36])
    return CCEChatMemory.from_defaults(session_id="li", engine=file_engine, max_tokens=300)


def test_simple_chat_engine_sends_the_capped_context(memory: CCEChatMemory,
                                                     file_engine: Engine) -> None:
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=4)
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    reply = chat.chat("What is the freezer alert threshold?")
    assert str(reply) == "text text text text"
    sent = list(llm.last_chat_messages or [])
    assert sent[0].role == MessageRole.SYSTEM
    assert "-16 °C" in (sent[0].content or "")
    assert sent[-1].role == MessageRole.USER
    assert sent[-1].content == "What is the freezer alert threshold?"
    assert _tokens(sent) <= 300
    turns = file_engine.turns("li")
    assert turns.height == 38  # question and reply stored
    assert turns["content"].to_list()[-1] == "text text text text"
    full = sum(estimate_tokens(c) + 4 for c in turns["content"])
    assert _tokens(sent) < full / 2


def test_async_chat_engine(memory: CCEChatMemory) -> None:
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=2)
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    reply = asyncio.run(chat.achat("Who insisted that we avoid a cluster?"))
    assert str(reply) == "text text"
    sent = list(llm.last_chat_messages or [])
    assert "Marco" in (sent[0].content or "")
    assert len(memory.get_all()) == 38


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20",
                            "ignore::pydantic.warnings.PydanticDeprecatedSince211")
def test_function_agent_accepts_the_memory(memory: CCEChatMemory) -> None:
    from llama_index.core.agent.workflow import FunctionAgent

    llm = MockFunctionCallingLLMWithChatMemoryOfLastCall()
    agent = FunctionAgent(llm=llm, tools=[])

    async def run() -> str:
        return str(await agent.run("Where is the meetup talk I am preparing?", memory=memory))

    assert asyncio.run(run()) == "Where is the meetup talk I am preparing?"  # the mock echoes
    sent = list(llm.last_chat_messages or [])
    assert "PyData meetup in Lisbon" in (sent[0].content or "")
    assert sent[-1].content == "Where is the meetup talk I am preparing?"
    assert len(memory.get_all()) == 38


def test_get_with_input_and_get_all(memory: CCEChatMemory) -> None:
    got = memory.get(input="Will Jonas co-present the talk?")
    assert got[0].role == MessageRole.SYSTEM
    assert "Twenty-five minutes" in (got[0].content or "")
    everything = memory.get_all()
    assert len(everything) == 36
    assert everything[0].content == sample()[0]["content"]
    hits = memory.search("sensor calibration offset", k=2)
    assert "B2-117" in " ".join(hits["content"].to_list())


def test_bad_input_changes_nothing(memory: CCEChatMemory) -> None:
    before = memory.get_all()
    with pytest.raises(ValidationError):
        memory.put_messages([ChatMessage(role="user", content="ok"),
                             ChatMessage(role="user", content="")])
    with pytest.raises(ValidationError):
        memory.set([ChatMessage(role="user", content=" ")])
    assert memory.get_all() == before
    with pytest.raises(ValidationError):
        CCEChatMemory.from_defaults(session_id="a/b", engine=memory.engine)
    with pytest.raises(ValidationError):
        CCEChatMemory.from_defaults(session_id="ok", engine=memory.engine, max_tokens=-5)


def test_from_defaults_with_data_dir_and_history(tmp_path: Path) -> None:
    history = [ChatMessage(role="user", content="My cat is called Pixel."),
               ChatMessage(role="assistant", content="Hello Pixel!")]
    mem = CCEChatMemory.from_defaults(session_id="pets", data_dir=tmp_path / "d",
                                      embedder="hash", chat_history=history, token_limit=200)
    again = CCEChatMemory.from_defaults(session_id="pets", data_dir=tmp_path / "d",
                                        embedder="hash", chat_history=history)
    assert mem.engine is again.engine
    assert mem.max_tokens == 200
    assert [m.content for m in again.get_all()] == ["My cat is called Pixel.", "Hello Pixel!"]
    assert [m.content for m in mem.get()] == ["My cat is called Pixel.", "Hello Pixel!"]
    assert CCEChatMemory.from_defaults(session_id="new", engine=mem.engine).get() == []
    mem.engine.close()


def test_set_replaces_and_reset_forgets(memory: CCEChatMemory) -> None:
    history = [ChatMessage(role="user", content="Fresh start: the budget is 4,500 euros."),
               ChatMessage(role="assistant", content="Noted, 4,500 euros.")]
    memory.set(history)
    assert [m.content for m in memory.get_all()] == [m.content for m in history]
    memory.set(history)  # the same history again: nothing changes
    assert len(memory.get_all()) == 2
    assert memory.engine.notes("li").is_empty()
    memory.reset()
    assert memory.get_all() == []
    assert memory.get() == []
    asyncio.run(memory.aput(ChatMessage(role="user", content="After the reset.")))
    assert [m.content for m in asyncio.run(memory.aget_all())] == ["After the reset."]
